/**
 * `node dist/hub-server.js --dir DIR --port N [--host 127.0.0.1]` — the local Hub on its own (B6).
 * The token, if any, comes from HF_TOKEN and is never printed. Prints one line: `LocalHub listening on URL`.
 */
import { LocalHub } from "./hub/server";

const HELP = `usage: node dist/hub-server.js --dir DIR [--port N] [--host HOST]

A file-backed Hugging Face Hub for @huggingface/hub clients (checkpoints of tstrain, offline runs, tests).
  --dir DIR     where repos are stored (created if absent)            required
  --port N      TCP port; 0 picks a free one                           default 0
  --host HOST   interface to bind                                      default 127.0.0.1
  --help        this text
If HF_TOKEN is set, every request must carry "Authorization: Bearer <HF_TOKEN>".
Point a client at it with hubUrl set to the printed URL.`;

function parse(argv: string[]): { dir: string; port: number; host: string } | null {
  let dir = "";
  let port = 0;
  let host = "127.0.0.1";
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const [flag, inline] = a.includes("=") ? [a.slice(0, a.indexOf("=")), a.slice(a.indexOf("=") + 1)] : [a, undefined];
    const value = (): string => {
      const v = inline ?? argv[++i];
      if (v === undefined || v === "") throw new Error(`${flag} needs a value`);
      return v;
    };
    switch (flag) {
      case "--help":
      case "-h":
        return null;
      case "--dir":
        dir = value();
        break;
      case "--port": {
        const v = value();
        port = Number(v);
        if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`--port ${v} is not a port number (0-65535)`);
        break;
      }
      case "--host":
        host = value();
        break;
      default:
        throw new Error(`unknown argument ${a} (see --help)`);
    }
  }
  if (!dir) throw new Error("--dir is required (see --help)");
  return { dir, port, host };
}

async function main(): Promise<void> {
  let o: ReturnType<typeof parse>;
  try {
    o = parse(process.argv.slice(2));
  } catch (e) {
    process.stderr.write(`hub-server: ${(e as Error).message}\n`);
    process.exitCode = 2;
    return;
  }
  if (!o) {
    process.stdout.write(HELP + "\n");
    return;
  }
  const token = process.env.HF_TOKEN || undefined;
  const hub = new LocalHub({ dir: o.dir, port: o.port, host: o.host, token });
  const url = await hub.start();
  process.stdout.write(`LocalHub listening on ${url} (dir ${o.dir}${token ? ", token required" : ""})\n`);
  const stop = () => {
    hub.stop().then(() => process.exit(0), () => process.exit(1));
  };
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
}

main().catch((e) => {
  process.stderr.write(`hub-server: ${(e as Error).message}\n`);
  process.exitCode = 1;
});
