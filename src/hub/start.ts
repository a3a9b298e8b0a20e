/**
 * K6, K9 at a run's start: the Hub calls a session makes before step 1 (the repo lookup, the pointer, the listings and
 * downloads of --resume auto, the repo's creation, its head) go through `HubAtStart`, which retries a transient failure
 * as the uploader does (K6: backoff, one line each, for --hub-retry-minutes). `checkHubAtStart` asks the Hub about the
 * repo first: an address that is not a Hub (NotAHubError), a host that does not exist, or a Hub that did not answer
 * for the whole budget is refused (K9), exit 2, before any work, naming the address and what to check; `openRepo`
 * creates the repo at the end of the plan and refuses a Hub whose storage fails (K9). The commits (`uploadFolder`,
 * `writePointer`) keep their callers' retries, which know when a retry may find its own commit (K8).
 */
import { UserError } from "../errors";
import { DEFAULT_HUB_URL } from "./address";
import type { CommitOptions, HubClient, Pointer, RemoteFile } from "./client";
import { describeHubError, isHubStorageFailure } from "./hub-errors";
import { codesOf, RetryExhausted, withRetry } from "./retry";

export interface HubStartOptions {
  /** The Hub's address, as the run names it (messages only). */
  hubUrl: string;
  log: (line: string) => void;
  /** --hub-retry-minutes, in ms. */
  giveUpMs: number;
  /** Backoff (ms): first wait, cap; K6's 500 and 30 000 by default. */
  baseMs?: number;
  capMs?: number;
}

/** The Hub client of a session's start: every read, the repo's creation and the head, retried as K6 retries. */
export class HubAtStart implements HubClient {
  constructor(
    private readonly inner: HubClient,
    private readonly o: HubStartOptions,
  ) {}

  get repo(): string {
    return this.inner.repo;
  }
  get repoType(): "dataset" | "model" {
    return this.inner.repoType;
  }
  get knownHead(): string | null {
    return this.inner.knownHead;
  }

  private retry<T>(what: string, fn: () => Promise<T>): Promise<T> {
    return withRetry(fn, {
      what: `${what} (${this.inner.repo} on ${this.o.hubUrl})`,
      log: this.o.log,
      giveUpMs: this.o.giveUpMs,
      baseMs: this.o.baseMs,
      capMs: this.o.capMs,
      permanent: refusedAtStart, // K9: the uploader retries these while training (K6), a start refuses them
    });
  }

  repoExists(): Promise<boolean> {
    return this.retry("the repo lookup", () => this.inner.repoExists());
  }
  ensureRepo(o?: { private?: boolean }): Promise<{ created: boolean }> {
    return this.retry("the repo's creation", () => this.inner.ensureRepo(o));
  }
  isPrivate(): Promise<boolean | null> {
    return this.retry("the repo's visibility", () => this.inner.isPrivate());
  }
  list(prefix?: string, o?: { hashRegular?: boolean }): Promise<RemoteFile[]> {
    return this.retry(`the listing of ${prefix ? `${prefix}/` : "the repo"}`, () => this.inner.list(prefix, o));
  }
  download(pathInRepo: string): Promise<Buffer | null> {
    return this.retry(`the download of ${pathInRepo}`, () => this.inner.download(pathInRepo));
  }
  downloadFolder(
    pathInRepo: string,
    destDir: string,
    o?: { progress?: (line: string) => void },
  ): Promise<{ files: number; bytes: number; seconds: number }> {
    return this.retry(`the download of ${pathInRepo}/`, () => this.inner.downloadFolder(pathInRepo, destDir, o));
  }
  readPointer(): Promise<Pointer | null> {
    return this.retry("the read of latest.json", () => this.inner.readPointer());
  }
  head(): Promise<string | null> {
    return this.retry("the read of the repo's head", () => this.inner.head());
  }
  followHead(head?: string | null): Promise<string | null> {
    return this.retry("the read of the repo's head", () => this.inner.followHead(head));
  }
  uploadFolder(localDir: string, pathInRepo: string, message: string, o?: CommitOptions): Promise<string | null> {
    return this.inner.uploadFolder(localDir, pathInRepo, message, o);
  }
  writePointer(p: Pointer, o?: CommitOptions): Promise<string | null> {
    return this.inner.writePointer(p, o);
  }
}

/** A TLS failure: the address speaks no TLS (an https:// URL for an http server), or its certificate is not trusted. */
function tlsCode(e: unknown): string | undefined {
  return codesOf(e).find((c) => /^ERR_SSL_|^ERR_TLS_|CERT|^EPROTO$/.test(c));
}

/** fetch will not connect to a port of another protocol (the Fetch standard's "bad port" list: 22, 25, 6000 …). */
function badPort(e: unknown): boolean {
  const cause = (e as { cause?: { message?: unknown } } | null)?.cause;
  return cause?.message === "bad port";
}

/**
 * K9: a failure K6 retries while training that a start refuses at once, since no wait mends it: the Hub's storage
 * failing, a host with no address, a TLS mismatch or an untrusted certificate, a port fetch will not use.
 */
function refusedAtStart(e: unknown): boolean {
  return isHubStorageFailure(e) || codesOf(e).includes("ENOTFOUND") || tlsCode(e) !== undefined || badPort(e);
}

/** What a K9 refusal advises: the same command once the Hub is fixed, and (a fresh start) one that needs no Hub of its own. */
export interface HubAdvice {
  /** The same command, to run again once the Hub answers. */
  again: string;
  /** The same run against the local Hub in this process (--hub-url embedded); null where that is no way out (a resume). */
  embedded: string | null;
}

function orEmbedded(a: HubAdvice): string {
  return a.embedded ? `; or train against the local Hub in this process: ${a.embedded}` : "";
}

/**
 * K9: the first question a run asks its Hub, before any work: does the repo exist? A NotAHubError, a host name with no
 * address, or no answer for the whole retry budget is refused here, exit 2, with what to check. Any other failure is
 * left to the calls that follow, whose refusals say what it means for them (R1, R2, K5).
 */
export async function checkHubAtStart(hub: HubAtStart, hubUrl: string, advice: HubAdvice): Promise<void> {
  try {
    await hub.repoExists();
  } catch (e) {
    const r = startRefusal(e, hubUrl, advice);
    if (r) throw r;
  }
}

/** K9: the refusal a failure at start means, or null when it is none of K9's. */
function startRefusal(e: unknown, hubUrl: string, advice: HubAdvice): UserError | null {
  const name = (e as { name?: unknown } | null)?.name;
  if (name === "NotAHubError")
    return new UserError(
      "K9",
      `the Hub address ${hubUrl} is not a Hub: ${(e as Error).message}. Check --hub-url (or HF_ENDPOINT): it names a Hub such as ${DEFAULT_HUB_URL}, or the URL node dist/hub-server.js prints${orEmbedded(advice)}`,
    );
  if (isHubStorageFailure(e)) return storageRefusal(e, hubUrl, advice);
  if (codesOf(e).includes("ENOTFOUND"))
    return new UserError(
      "K9",
      `the Hub address ${hubUrl} names a host that has no address (ENOTFOUND: ${describeHubError(e)}). Check the host name in --hub-url (or HF_ENDPOINT) and this machine's network (DNS)${orEmbedded(advice)}`,
    );
  const tls = tlsCode(e);
  if (tls && /^ERR_SSL_WRONG_VERSION|^EPROTO$/.test(tls)) {
    // the same host and port, spoken to in plain HTTP
    const plain = new URL(hubUrl);
    const port = plain.port || "443";
    plain.protocol = "http:";
    plain.port = port;
    return new UserError(
      "K9",
      `the Hub address ${hubUrl} fails its TLS handshake (${tls}): the server there speaks plain HTTP: run `,
      {
        ways: [{ changes: [["--hub-url", plain.href.replace(/\/+$/, "")]], why: "the address with http://" }],
        after: orEmbedded(advice),
      },
    );
  }
  if (tls)
    return new UserError(
      "K9",
      `the Hub address ${hubUrl} fails its TLS handshake (${tls}): its certificate is not one this machine trusts: give node the certificate of the authority that signed it (export NODE_EXTRA_CA_CERTS=<that CA's .pem>) and run the same command again${orEmbedded(advice)}`,
    );
  if (badPort(e))
    return new UserError(
      "K9",
      `the Hub address ${hubUrl} names port ${new URL(hubUrl).port}, one that fetch will not connect to (the Fetch standard bars the ports of other protocols, as 22, 25 or 6000): run the Hub on another port (node dist/hub-server.js --port 0 picks a free one) and name that${orEmbedded(advice)}`,
    );
  if (e instanceof RetryExhausted)
    return new UserError(
      "K9",
      `the Hub at ${hubUrl} did not answer: ${e.message}. Check that it runs and that --hub-url (or HF_ENDPOINT) names it, then run the same command again: ${advice.again}${orEmbedded(advice)}`,
    );
  return null;
}

function storageRefusal(e: unknown, hubUrl: string, advice: HubAdvice): UserError {
  return new UserError(
    "K9",
    `the Hub at ${hubUrl} cannot store files: ${describeHubError(e)}. Check the Hub's disk: free space there, or restart node dist/hub-server.js on a writable --dir, then run the same command again: ${advice.again}${orEmbedded(advice)}`,
  );
}

/**
 * K5, K8, K9 at the end of a run's plan, before any work: the repo created (private unless --no-hub-private) and its
 * head read, from which every commit names its parent. A Hub whose storage fails is refused here.
 */
export async function openRepo(
  hub: HubAtStart,
  wantPrivate: boolean,
  hubUrl: string,
  advice: HubAdvice,
): Promise<{ created: boolean; head: string | null }> {
  try {
    const { created } = await hub.ensureRepo({ private: wantPrivate });
    return { created, head: await hub.followHead() };
  } catch (e) {
    throw startRefusal(e, hubUrl, advice) ?? createRefusal(e, hub.repo, hubUrl, advice) ?? e;
  }
}

/**
 * K5, K9: the Hub answered the repo's creation with a refusal no retry mends: the token may not create it (401, 403:
 * K5), or the address does not serve the Hub's routes (a 404 or 400 there: a path after the host, say).
 */
function createRefusal(e: unknown, repo: string, hubUrl: string, advice: HubAdvice): UserError | null {
  const status = (e as { statusCode?: unknown } | null)?.statusCode;
  if (typeof status !== "number") return null;
  if (status === 401 || status === 403)
    return new UserError(
      "K5",
      `the Hub at ${hubUrl} refused to create ${repo} (${describeHubError(e)}): HF_TOKEN ${process.env.HF_TOKEN ? "has no right to create it (a read token, or one for another owner)" : "is not set"}. Set HF_TOKEN to a token with write access to ${repo}'s owner (export HF_TOKEN=hf_…), or create the repo on the Hub, then run the same command again: ${advice.again}`,
    );
  if (status === 404 || status === 400 || status === 405) {
    const what = `the Hub at ${hubUrl} has no route to create ${repo} (${describeHubError(e)}): --hub-url (or HF_ENDPOINT) names the Hub's root, as ${DEFAULT_HUB_URL} or the URL node dist/hub-server.js prints, with no path after the host`;
    const root = new URL(hubUrl).origin;
    return root === hubUrl
      ? new UserError("K9", `${what}${orEmbedded(advice)}`)
      : new UserError("K9", `${what}: run `, {
          ways: [{ changes: [["--hub-url", root]], why: "the Hub's root" }],
          after: orEmbedded(advice),
        });
  }
  return null;
}
