/**
 * `node dist/prepare.js --input FILE|DIR|hf://datasets/owner/name[@rev]/glob ... --tokenizer tokenizer.json|owner/name
 *   --out ROOT [--text-field NAME] [--hub-url URL] [--val-fraction F] [--shard-tokens N] [--workers N] [--eos-token NAME] [--force]`
 * Builds a mix root (D2). See src/data/prepare-mix.ts for the format and the rules.
 * A refusal prints one line without a stack and exits 2; a bug keeps its stack and exits 1.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { fsRefusal, isUserError, UserError } from "./errors";
import { guardOutput } from "./pipes";
import { type CliSyntax, commandWith, type FlagArgs, type FlagTable, parseFlags, shellWord } from "./cli-args";
import { removeScratchNow } from "./data/prepare-scratch";
import { DEFAULT_HUB_URL } from "./hub/address";
import { DEFAULT_SHARD_TOKENS, DEFAULT_VAL_FRACTION, prepareMix, type PrepareOptions } from "./data/prepare-mix";

const USAGE = `usage: node dist/prepare.js --input FILE|DIR|hf://datasets/owner/name[@rev]/glob ... --tokenizer tokenizer.json|owner/name --out ROOT
  inputs: .txt .text .md (documents split at lines holding only the EOS token), .jsonl, .jsonl.gz, .jsonl.zst, .parquet
  [--text-field NAME]  the JSON field / Parquet column with the text (default text)
  [--hub-url URL]      Hub endpoint for hf:// inputs and Hub tokenizers (default $HF_ENDPOINT, else ${DEFAULT_HUB_URL}; token from HF_TOKEN)
  [--val-fraction F]   held-out documents, 0..0.5 (default ${DEFAULT_VAL_FRACTION})
  [--shard-tokens N]   tokens per shard file (default ${DEFAULT_SHARD_TOKENS})
  [--workers N]        tokenizer threads (default: CPU count, at most 8)
  [--eos-token NAME]   end-of-document token (default: tokenizer_config.json's eos_token, else <|endoftext|>, </s>, ...)
  [--force]            replace an existing ROOT (the old one is moved aside, never deleted)`;

/** D2: a flag's value: present, and not the next flag */
const PREPARE_SYNTAX: CliSyntax = {
  value(flag, v) {
    if (v === undefined || v.startsWith("--")) throw new UserError("D2", `${flag} needs a value\n${USAGE}`);
    return v;
  },
  unknown: (a) => new UserError("D2", `unknown argument ${JSON.stringify(a)}\n${USAGE}`),
  repeated: (given, once) =>
    new UserError(
      "D2",
      `${given.join(" and ")} set the same flag: a flag is read once, and all but one would be dropped without a word. Give each once, as in node dist/prepare.js ${once.map(shellWord).join(" ")}`,
    ),
  repeatable: ["--input"],
};

/** The number flags' defaults, which a value that is no number is told to pass instead (--workers: one thread). */
const NUMBER_ADVICE: Readonly<Record<string, [value: string, why: string]>> = {
  "--val-fraction": [String(DEFAULT_VAL_FRACTION), "its default"],
  "--shard-tokens": [String(DEFAULT_SHARD_TOKENS), "its default"],
  "--workers": ["1", "one thread; its default is the CPU count, at most 8"],
};

function num(a: FlagArgs): number {
  const v = a.value();
  const n = Number(v.replace(/_/g, ""));
  if (!Number.isFinite(n)) {
    const [value, why] = NUMBER_ADVICE[a.flag];
    throw new UserError("D2", `${a.flag} ${JSON.stringify(v)} is not a number: run `, {
      ways: [{ changes: [[a.flag, value]], why }],
      after: `\n${USAGE}`,
    });
  }
  return n;
}

const PREPARE_FLAGS: FlagTable<PrepareOptions> = {
  "--input": (o, a) => o.inputs.push(a.value(), ...a.more()),
  "--tokenizer": (o, a) => {
    o.tokenizer = a.value();
  },
  "--out": (o, a) => {
    o.out = a.value();
  },
  "--val-fraction": (o, a) => {
    o.valFraction = num(a);
  },
  "--shard-tokens": (o, a) => {
    o.shardTokens = num(a);
  },
  "--workers": (o, a) => {
    o.workers = num(a);
  },
  "--eos-token": (o, a) => {
    o.eosToken = a.value();
  },
  "--text-field": (o, a) => {
    o.textField = a.value();
  },
  "--hub-url": (o, a) => {
    o.hubUrl = a.value();
  },
  "--force": (o) => {
    o.force = true;
  },
};

export function parsePrepareArgs(argv: string[]): PrepareOptions | null {
  const o = parseFlags<PrepareOptions>(argv, { inputs: [], tokenizer: "", out: "" }, PREPARE_FLAGS, PREPARE_SYNTAX);
  if (o === null) return null;
  if (o.inputs.length === 0 || !o.tokenizer || !o.out)
    throw new UserError("D2", `prepare needs --input, --tokenizer and --out\n${USAGE}`);
  return o;
}

/** D2: SIGINT/SIGTERM stops the build, removes its partial folder and says what it removed and what it left. */
function onSignals(out: string): void {
  const handler = (sig: NodeJS.Signals) => {
    const removed = removeScratchNow();
    const root = path.resolve(out);
    const left = fs.existsSync(root) ? `${root} is unchanged` : `nothing was written at ${root}`;
    process.stderr.write(
      `\nprepare: ${sig}: stopped; ${removed.length ? `removed ${removed.join(" and ")} (the partial build)` : "there was no partial build to remove"}; ${left}. Run the same command again to build the mix from the start.\n`,
    );
    process.exit(sig === "SIGINT" ? 130 : 143);
  };
  process.once("SIGINT", handler);
  process.once("SIGTERM", handler);
}

async function main(): Promise<void> {
  guardOutput("the mix is still built"); // O7: `| head` ends no build
  try {
    const o = parsePrepareArgs(process.argv.slice(2));
    if (o === null) {
      process.stdout.write(`${USAGE}\n`);
      return;
    }
    onSignals(o.out);
    await prepareMix({ ...o, progress: "auto" });
  } catch (caught) {
    const e = fsRefusal(caught, "O6") ?? caught; // a full disk or a bad path is the user's to fix, not a bug
    if (isUserError(e)) {
      // advice that changes the command line: the whole command that does it
      const argv = process.argv.slice(2);
      const said =
        e instanceof UserError ? e.withCommands((ch) => commandWith(["node", "dist/prepare.js"], argv, ...ch)) : e;
      process.stderr.write(`prepare: ${said.message}\n`);
      process.exitCode = 2;
    } else {
      process.stderr.write(`prepare: internal error (a bug, please report): ${(e as Error)?.stack ?? String(e)}\n`);
      process.exitCode = 1;
    }
  }
}

if (require.main === module || require.main?.filename?.endsWith(`${require("node:path").sep}prepare.js`)) {
  void main();
}
