/**
 * `node dist/hub-server.js --dir DIR [--port N] [--host H] [--tokens FILE] [--faults FILE]` — the
 * local Hub on its own (B6). Tokens come from HF_TOKEN (write role) and --tokens, and are never
 * printed. Prints `LocalHub listening on URL`, then one `LocalHub event: {json}` line per event.
 */
import { LocalHub, loadTokensFile, type HubToken } from "./hub/server";
import { fsRefusal } from "./errors";
import { type FlagTable, parseFlags } from "./cli-args";

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
    if (!Number.isInteger(o.port) || o.port < 0 || o.port > 65535)
      throw new Error(`--port ${v} is not a port number (0-65535)`);
  },
};

function parse(argv: string[]): CliOptions | null {
  const o = parseFlags<CliOptions>(
    argv,
    { dir: "", port: 0, host: "127.0.0.1", tokensFile: "", faultsFile: "" },
    FLAGS,
    {
      inline: true,
      value(flag, v) {
        if (v === undefined || v === "") throw new Error(`${flag} needs a value`);
        return v;
      },
      unknown: (a) => new Error(`unknown argument ${a} (see --help)`),
    },
  );
  if (o && !o.dir) throw new Error("--dir is required (see --help)");
  return o;
}

async function main(): Promise<void> {
  let o: CliOptions | null;
  let tokens: HubToken[] = [];
  try {
    o = parse(process.argv.slice(2));
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
  const url = await hub.start();
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
  const refused = fsRefusal(e, "O6"); // O6: an unwritable --dir or a port in use is the user's to fix
  process.stderr.write(`hub-server: ${(refused ?? (e as Error)).message}\n`);
  process.exitCode = refused ? 2 : 1;
});
