// The embedded local Hub of a run (--hub-url embedded, the demo's default) stores its files under
// the run's own folder, or --hub-dir, and says where (B6, L8).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { listCommits } from "@huggingface/hub";
import { LocalHub } from "../src/hub/server";
import { parseArgs } from "../src/config";
import { writeSyntheticMix } from "./helpers/mix";
import { runTiny, tinyConfig } from "./helpers/run";
import { tmpDir } from "./helpers/tmp";

const mix = writeSyntheticMix({ vocab: 64, trainTokens: 16 * 1024, valTokens: 1024 });
const refs = (hubDir: string) => path.join(hubDir, "datasets", "me", "demo", "refs.json");

async function commitsIn(hubDir: string): Promise<string[]> {
  const hub = new LocalHub({ dir: hubDir });
  const url = await hub.start();
  try {
    const out: string[] = [];
    for await (const c of listCommits({ repo: { type: "dataset", name: "me/demo" }, hubUrl: url })) out.push(c.title);
    return out;
  } finally {
    await hub.stop();
  }
}

test("two runs with embedded Hubs under sibling --out folders each keep their own Hub in <out>/hub", {
  timeout: 120_000,
}, async () => {
  const base = tmpDir("tstrain-embedded-");
  const run = (out: string, extra: string[] = []) =>
    runTiny(
      tinyConfig(mix.root, out, ["--hub-url", "embedded", "--hub-repo", "me/demo", "--max-steps", "4", ...extra]),
    );
  const a = await run(path.join(base, "a"));
  const b = await run(path.join(base, "b"));
  assert.ok(fs.existsSync(refs(path.join(base, "a", "hub"))), "run a's Hub is in a/hub");
  assert.ok(fs.existsSync(refs(path.join(base, "b", "hub"))), "run b's Hub is in b/hub");
  assert.ok(!fs.existsSync(path.join(base, "hub")), "nothing is written beside the run folders");
  assert.ok(
    a.rep.lines.some((l) => l.includes(`storing ${path.join(base, "a", "hub")}`)),
    "the run says where its Hub is",
  );
  assert.ok(b.rep.lines.some((l) => l.includes(`storing ${path.join(base, "b", "hub")}`)));
  // b did not find a's checkpoints: each Hub holds one run's history.
  const titles = await commitsIn(path.join(base, "b", "hub"));
  assert.equal(titles.filter((t) => /checkpoint-4/.test(t)).length, 1, titles.join(" | "));

  const c = await run(path.join(base, "c"), ["--hub-dir", path.join(base, "hubs", "c")]);
  assert.ok(fs.existsSync(refs(path.join(base, "hubs", "c"))), "--hub-dir is where the Hub goes");
  assert.ok(!fs.existsSync(path.join(base, "c", "hub")));
  assert.ok(c.rep.lines.some((l) => l.includes(`storing ${path.join(base, "hubs", "c")}`)));
});

test("--hub-dir without --hub-url embedded is refused, naming both flags", () => {
  assert.throws(
    () => parseArgs(["--hub-dir", "/tmp/x", "--hub-url", "https://huggingface.co"]),
    (e: Error & { rule?: string }) => {
      assert.equal(e.rule, "B6");
      assert.match(
        e.message,
        /--hub-dir "\/tmp\/x" is the folder of the embedded local Hub, but --hub-url is https:\/\/huggingface\.co; run node dist\/main\.js --hub-dir \/tmp\/x --hub-url embedded \(the embedded Hub, in --hub-dir\), or node dist\/main\.js --hub-url https:\/\/huggingface\.co \(the Hub at https:\/\/huggingface\.co\) \[B6\]$/,
      );
      return true;
    },
  );
});
