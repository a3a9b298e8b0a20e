/**
 * `node dist/hub-server.js --dir DIR [--port N] [--host H] [--tokens FILE] [--faults FILE]` — the
 * local Hub on its own (B6). Tokens come from HF_TOKEN (write role) and --tokens, and are never
 * printed. Prints `LocalHub listening on URL`, then one `LocalHub event: {json}` line per event.
 */
import { LocalHub, loadTokensFile, type HubToken } from "./hub/server";
import * as os from "node:os";
import * as path from "node:path";
import { fsRefusal, isUserError, UserError } from "./errors";
import { commandWith, type FlagTable, parseFlags } from "./cli-args";

const HELP = `usage: node dist/hub-server.js --dir DIR [--port N] [--host HOST] [--tokens FILE] [--faults FILE]

A file-backed Hugging Face Hub for @huggingface/hub clients (checkpoints of tstrain, offline runs, tests).
  --dir DIR       where repos are stored (created if absent); several servers may share it   required
  --port N        TCP port; 0 picks a free one                                                 default 0
  --host HOST     interface to bind                                                            default 127.0.0.1
  --tokens FILE   JSON {"tokens": [{"token": "hf_...", "role": "read"|"write", "name": "ci"}]}
  --faults FILE   JSON faults (e.g. {"status": {"commit": 500}, "failCount": 2}), re-read whenever
                  the file changes; delete it or write {} to clear (docs/hub.md: fault rehearsal)
  --help          this text
HF_TOKEN, if set, is one more token with the write role. With no token at all the Hub is open;
with tokens, anonymous callers may only read public repos.
Point a client at it with hubUrl set to the printed URL.`;

interface CliOptions {
  dir: string;
  port: number;
  host: string;
  tokensFile: string;
  faultsFile: string;
}

const FLAGS: FlagTable<CliOptions> = {
  "--dir": (o, a) => {
    o.dir = a.value();
  },
  "--host": (o, a) => {
    o.host = a.value();
  },
  "--tokens": (o, a) => {
    o.tokensFile = a.value();
  },
  "--faults": (o, a) => {
    o.faultsFile = a.value();
  },
  "--port": (o, a) => {
    const v = a.value();
    o.port = Number(v);
    if (v.trim() === "" || !Number.isInteger(o.port) || o.port < 0 || o.port > 65535)
      throw new UserError(
        "L9",
        `--port ${v} is not a port number (0-65535): pass one, or 0 for a free one, as in ${sameWith("--port", "0")}`,
      );
  },
};

let argv: string[] = [];

/** L9: this command as it was given, with `flag value` in place of the flag's value (advice that runs). */
function sameWith(flag: string, value: string): string {
  return commandWith(["node", "dist/hub-server.js"], argv, [flag, value]);
}

/** A folder the advice can name that any user can write. */
const WRITABLE_DIR = path.join(os.tmpdir(), "tstrain-hub");

function parse(): CliOptions | null {
  const o = parseFlags<CliOptions>(
    argv,
    { dir: "", port: 0, host: "127.0.0.1", tokensFile: "", faultsFile: "" },
    FLAGS,
    {
      inline: true,
      value(flag, v) {
        if (v === undefined || v === "")
          throw new UserError("L9", `${flag} needs a value (node dist/hub-server.js --help lists the flags)`);
        return v;
      },
      unknown: (a) => new UserError("L9", `unknown argument ${a}: node dist/hub-server.js --help lists the flags`),
    },
  );
  if (o && !o.dir)
    throw new UserError(
      "L9",
      `--dir is required: the folder the Hub stores its repos in, as in ${sameWith("--dir", WRITABLE_DIR)}`,
    );
  return o;
}

/** Why a --dir cannot hold the Hub's files, by the error's code. */
const DIR_MEANING: Record<string, string> = {
  EROFS: "it is on a read-only filesystem (EROFS)",
  ENOSPC: "its disk is full (ENOSPC)",
  EDQUOT: "the disk quota is used up (EDQUOT)",
  EACCES: "this user may not write there (EACCES)",
  EPERM: "this user may not write there (EPERM)",
  ENOTDIR: "a part of its path is a file, not a folder (ENOTDIR)",
  ENOENT: "it cannot be created (ENOENT)",
  EIO: "its disk fails to write (EIO)",
};

/**
 * L9: what keeps the server from serving, said with the command that works: a --dir that cannot hold its files, a
 * --host that is no address of this machine, a --port in use or barred. Null for anything else (O6, then a bug).
 */
function startRefusal(e: unknown, o: CliOptions): UserError | null {
  const x = e as NodeJS.ErrnoException & { hostname?: string };
  if (typeof x !== "object" || x === null || typeof x.code !== "string") return null;
  const where = `${x.syscall ?? "access"}${x.path ? ` ${x.path}` : ""}`;
  if (x.syscall === "getaddrinfo" || x.code === "EADDRNOTAVAIL")
    return new UserError(
      "L9",
      `--host ${o.host} is not an address of this machine (${x.code}${x.syscall === "getaddrinfo" ? ": no such host" : ""}): name one of its addresses, as in ${sameWith("--host", "127.0.0.1")} (0.0.0.0: every interface)`,
    );
  if (x.syscall === "listen" && x.code === "EADDRINUSE")
    return new UserError(
      "L9",
      `--port ${o.port} is in use on ${o.host} (EADDRINUSE): pick another, or a free one, as in ${sameWith("--port", "0")}`,
    );
  if (x.syscall === "listen" && (x.code === "EACCES" || x.code === "EPERM"))
    return new UserError(
      "L9",
      `--port ${o.port} needs privileges this user lacks (${x.code}): use one above 1023, or a free one, as in ${sameWith("--port", "0")}`,
    );
  const meaning = DIR_MEANING[x.code];
  if (meaning && x.syscall !== "listen")
    return new UserError(
      "L9",
      `--dir ${o.dir} cannot hold the Hub's files: ${meaning}, at ${where}: give it a writable folder with room, as in ${sameWith("--dir", WRITABLE_DIR)}`,
    );
  return null;
}

async function main(): Promise<void> {
  argv = process.argv.slice(2);
  let o: CliOptions | null;
  let tokens: HubToken[] = [];
  try {
    o = parse();
    if (o?.tokensFile) tokens = loadTokensFile(o.tokensFile);
  } catch (e) {
    process.stderr.write(`hub-server: ${(e as Error).message}\n`);
    process.exitCode = 2;
    return;
  }
  if (!o) {
    process.stdout.write(`${HELP}\n`);
    return;
  }
  const token = process.env.HF_TOKEN || undefined;
  const onEvent = (e: unknown) => process.stdout.write(`LocalHub event: ${JSON.stringify(e)}\n`);
  const hub = new LocalHub({
    dir: o.dir,
    port: o.port,
    host: o.host,
    token,
    tokens,
    faultsFile: o.faultsFile || undefined,
    onEvent,
  });
  let url: string;
  try {
    url = await hub.start();
  } catch (e) {
    throw startRefusal(e, o) ?? e;
  }
  const n = tokens.length + (token ? 1 : 0);
  process.stdout.write(
    `LocalHub listening on ${url} (dir ${o.dir}${n ? `, ${n} token(s), anonymous callers read public repos only` : ", open: no token configured"})\n`,
  );
  const stop = () => {
    hub.stop().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
}

main().catch((e) => {
  const refused = isUserError(e) ? e : fsRefusal(e, "O6"); // L9, O6: what the user can fix is no bug
  process.stderr.write(`hub-server: ${(refused ?? (e as Error)).message}\n`);
  process.exitCode = refused ? 2 : 1;
});
