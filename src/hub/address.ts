/**
 * Where the Hub is and how its things are named, each said once: the endpoint every command talks to (`--hub-url`,
 * then `HF_ENDPOINT`, then the Hugging Face Hub), the `hf://` grammar of prepare's inputs and tokenizers and of
 * generate's models (`@revision` included), the Hub's rule for a repo id, and the rule for a path inside a repo.
 * The trainer (config.ts), prepare (data/hub-input.ts), generate, the Hub client and the local Hub read them here.
 */
import { UserError } from "../errors";
import flagTable from "../config-flags.json";

/** The Hugging Face Hub: the default of --hub-url, as the flag table (config-flags.json) gives it. */
export const DEFAULT_HUB_URL: string = (() => {
  const row = (flagTable as { flag: string; def: unknown }[]).find((r) => r.flag === "hub-url");
  if (!row || typeof row.def !== "string") throw new Error("config-flags.json has no string default for hub-url");
  return row.def;
})();

// ---- the endpoint ----------------------------------------------------------------------------------

/**
 * G10, G11, D2: why a Hub endpoint is not one, in words that end a refusal ("is not an http(s) URL such as" the
 * default); null when it is an http(s) URL with a host and no user, password, query or fragment
 * (a path is kept: a Hub behind a proxy may live under one).
 */
export function hubUrlProblem(url: string): string | null {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return `is not an http(s) URL such as ${DEFAULT_HUB_URL}`;
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") return `is not an http(s) URL such as ${DEFAULT_HUB_URL}`;
  if (u.username || u.password)
    return "holds a user name or password, which every log line would show: the Hub's token comes from HF_TOKEN only; drop them from the URL";
  if (u.search || u.hash || url.includes("?") || url.includes("#"))
    return "has a query or fragment (?… or #…), and the Hub's routes are appended to the address: drop it";
  return null;
}

/**
 * The URL with what hubUrlProblem refuses in it dropped (a user, a password, a query, a fragment), when that makes
 * it an endpoint; null when it is no http(s) URL at all.
 */
export function hubUrlFixed(url: string): string | null {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return null;
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") return null;
  u.username = "";
  u.password = "";
  u.search = "";
  u.hash = "";
  const fixed = u.href.replace(/\/+$/, "");
  return hubUrlProblem(fixed) === null ? fixed : null;
}

/** The endpoint in one spelling: the URL's own (lower-case scheme and host, no default port), no trailing "/". */
export function canonicalHubUrl(url: string): string {
  return new URL(url).href.replace(/\/+$/, "");
}

export interface HubEndpoint {
  url: string;
  /** Where it came from, for messages. */
  from: "--hub-url" | "HF_ENDPOINT" | "default";
}

/**
 * The Hub a command talks to: `--hub-url` when given (non-empty), else `HF_ENDPOINT` when set (non-empty), else the
 * Hugging Face Hub. A bad value is refused under `rule`, naming where it came from, with the fix.
 */
export function hubEndpoint(
  given: string | undefined,
  rule: string,
  env: NodeJS.ProcessEnv = process.env,
): HubEndpoint {
  if (given !== undefined) {
    const bad = hubUrlProblem(given);
    if (bad)
      throw new UserError(rule, `--hub-url ${JSON.stringify(given)} ${bad}: run `, {
        ways: [{ changes: [["--hub-url", hubUrlFixed(given) ?? DEFAULT_HUB_URL]] }],
      });
    return { url: canonicalHubUrl(given), from: "--hub-url" };
  }
  const fromEnv = endpointFromEnv(rule, env);
  return fromEnv ? { url: fromEnv, from: "HF_ENDPOINT" } : { url: DEFAULT_HUB_URL, from: "default" };
}

/** HF_ENDPOINT when set and not empty (canonical), refused under `rule` when it is no Hub endpoint; else null. */
export function endpointFromEnv(rule: string, env: NodeJS.ProcessEnv = process.env): string | null {
  const v = env.HF_ENDPOINT;
  if (v === undefined || v === "") return null;
  const bad = hubUrlProblem(v);
  if (bad)
    throw new UserError(
      rule,
      `HF_ENDPOINT ${JSON.stringify(v)} ${bad}; set it to a Hub's address (export HF_ENDPOINT=${DEFAULT_HUB_URL}) or unset it (unset HF_ENDPOINT)`,
    );
  return canonicalHubUrl(v);
}

// ---- a repo id ---------------------------------------------------------------------------------------

/**
 * The Hub's rule for a repo id: what huggingface_hub's validate_repo_id accepts, with the owner required (a run's repo
 * is always owner/name). Each part is letters, digits, "_", "-" and "."; it starts and ends with a letter, digit or
 * "_" (so `owner/_x` is a name, `owner/-x` and `owner/x.` are not); "--" and ".." appear nowhere; the name is at most
 * 96 characters and does not end in ".git". The flags that name a repo (--hub-repo, an hf:// input or model) are
 * checked against it where they are read; the Hub client and the local Hub hold to it.
 */
export const REPO_ID_RULE =
  'owner/name: letters, digits, "_", "-" and "."; each part starting and ending with a letter, digit or "_"; no "--" or ".."; the name at most 96 characters, not ending in ".git"';

const PART = /^[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?$/;

/** Whether `repo` is a repo id owner/name the Hub accepts (REPO_ID_RULE). */
export function isRepoId(repo: unknown): repo is string {
  if (typeof repo !== "string") return false;
  const parts = repo.split("/");
  return (
    parts.length === 2 &&
    parts.every((p) => PART.test(p)) &&
    parts[1].length <= 96 &&
    !repo.includes("--") &&
    !repo.includes("..") &&
    !repo.endsWith(".git")
  );
}

// ---- a path inside a repo ----------------------------------------------------------------------------

/** The rule for a path inside a repo, in the words a refusal quotes. */
export const REPO_PATH_RULE = 'a relative path inside the repo: "/"-separated, with no empty, "." or ".." part';

/** Whether `p` is a path inside a repo (REPO_PATH_RULE): the client sends only such paths, the local Hub stores only them. */
export function isRepoPath(p: unknown): p is string {
  return (
    typeof p === "string" &&
    p !== "" &&
    !p.startsWith("/") &&
    p.split("/").every((s) => s !== "" && s !== "." && s !== "..")
  );
}

// ---- hf:// -------------------------------------------------------------------------------------------

/** `hf://datasets/owner/name[@revision][/path]` (or `hf://models/…`), parsed. */
export interface HfUrl {
  repoType: "dataset" | "model";
  repo: string;
  /** The branch, tag or commit after "@" (URL-decoded: a "/" in it is written %2F); "main" when none is given. */
  revision: string;
  /** The path inside the repo after the repo id ('' = the whole repo), without trailing "/". */
  path: string;
}

/** Whether `s` is an hf:// address (then parseHfUrl reads it, or refuses it). */
export function isHfUrl(s: string): boolean {
  return s.startsWith("hf://");
}

/**
 * The one parser of hf:// addresses (`what`: the flag, e.g. "--input"; refusals under `rule`, quoting `form`, the
 * shape the flag takes, e.g. "hf://datasets/owner/name[@revision]/path-glob"). `needPath`: a path must follow the
 * repo id (generate names a folder).
 */
export function parseHfUrl(s: string, o: { what: string; rule: string; form: string; needPath?: string }): HfUrl {
  const { what, rule, form } = o;
  const m = /^hf:\/\/(datasets|models)\/([^/@]+)\/([^/@]+)(?:@([^/]*))?(?:\/(.*))?$/.exec(s);
  if (!m) throw new UserError(rule, `${what} ${s} is not a Hub URL of the form ${form}`);
  const repo = `${m[2]}/${m[3]}`;
  if (!isRepoId(repo))
    throw new UserError(rule, `${what} ${s}: "${repo}" is not a Hub repo id (${REPO_ID_RULE}); use ${form}`);
  let revision = "main";
  if (m[4] !== undefined) {
    if (m[4] === "")
      throw new UserError(rule, `${what} ${s}: empty revision after "@"; drop the "@" or name a branch, tag or commit`);
    try {
      revision = decodeURIComponent(m[4]);
    } catch {
      throw new UserError(
        rule,
        `${what} ${s}: the revision "${m[4]}" is not valid URL encoding; write a "/" in a revision as %2F`,
      );
    }
  }
  const path = (m[5] ?? "").replace(/\/+$/, "");
  if (path !== "" && !isRepoPath(path))
    throw new UserError(rule, `${what} ${s}: the path after the repo id must be ${REPO_PATH_RULE}`);
  if (path === "" && o.needPath) throw new UserError(rule, `${what} ${s} names no path in the repo: ${o.needPath}`);
  return { repoType: m[1] === "datasets" ? "dataset" : "model", repo, revision, path };
}
