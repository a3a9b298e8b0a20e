// Reporting: the loss-curve picture (B5), the duration format of the progress lines and their one rhythm.
import { test } from "node:test";
import assert from "node:assert/strict";
import { lossCurveSvg } from "../src/report";
import { fmtDuration } from "../src/duration";
import { etaOf, FIRST_LINE_SECONDS, ProgressRhythm, progressEverySeconds } from "../src/progress";
import type { LogEntry } from "../src/checkpoint";
import * as fs from "node:fs";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { tmpDir } from "./helpers/tmp";

const COMPARE = path.join(__dirname, "..", "compare.js");

const entry = (step: number, loss: number): LogEntry => ({
  step,
  loss,
  lr: 1e-3,
  grad_norm: 1,
  loss_scale: 65536,
  skipped_steps: 0,
  tok_per_s: 1,
  elapsed_s: step,
});

test("the loss curve is an SVG polyline with one point per finite logged loss (B5)", () => {
  const svg = lossCurveSvg([entry(10, 5), entry(20, 4), entry(30, Number.NaN), entry(40, 3)]);
  assert.match(svg, /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"/);
  const pts = /<polyline[^>]*points="([^"]+)"/.exec(svg)![1].split(" ");
  assert.equal(pts.length, 3);
  const ys = pts.map((p) => Number(p.split(",")[1]));
  assert.ok(ys[0] < ys[1] && ys[1] < ys[2], "a falling loss is drawn from the top down (SVG y grows downward)");
  assert.match(lossCurveSvg([]), /no finite loss logged yet/);
});

test("durations print as h/m/s", () => {
  assert.equal(fmtDuration(5), "5s");
  assert.equal(fmtDuration(125), "2m05s");
  assert.equal(fmtDuration(3725), "1h02m");
  assert.equal(fmtDuration(Number.NaN), "?");
});

test("every progress reporter's rhythm: the first line after 5 s of work, then one every TSTRAIN_PROGRESS_SECONDS, ETAs as fmtDuration (B5)", () => {
  assert.equal(FIRST_LINE_SECONDS, 5);
  assert.equal(progressEverySeconds(undefined), 30);
  assert.equal(progressEverySeconds("2.5"), 2.5);
  assert.equal(progressEverySeconds("soon"), 30);
  assert.equal(progressEverySeconds("-1"), 30);
  const lines = (everyMs: number, at: number[]) => {
    const r = new ProgressRhythm(everyMs, 0);
    return at.filter((t) => r.due(t));
  };
  // the default: nothing for quick work, a line at 5 s, then every 30 s counted from the last line
  assert.deepEqual(lines(30_000, [1000, 4999, 5000, 6000, 34_999, 35_000, 64_000, 65_500]), [5000, 35_000, 65_500]);
  // a rhythm shorter than 5 s starts at once with it
  assert.deepEqual(lines(2000, [1000, 2000, 3000, 4100, 6000, 6100]), [2000, 4100, 6100]);
  // 0: a line at every chance
  assert.deepEqual(lines(0, [0, 1, 2]), [0, 1, 2]);
  assert.equal(etaOf(125, 1), "2m05s");
  assert.equal(etaOf(7450, 2), "1h02m");
  assert.equal(etaOf(10, 0), "?", "no rate yet");
});

test("compare.js prints two runs' losses step by step with the largest relative difference, draws both curves, and refuses a folder without metrics (B5)", () => {
  const a = tmpDir("tstrain-cmp-a-"),
    b = tmpDir("tstrain-cmp-b-");
  const write = (dir: string, losses: number[]) =>
    fs.writeFileSync(
      path.join(dir, "metrics.jsonl"),
      `${losses.map((l, i) => JSON.stringify(entry(25 * (i + 1), l))).join("\n")}\n`,
    );
  write(a, [8, 7, 6, 5]);
  write(b, [8, 7.7, 6.06, 5.04]); // +10 % at step 50 (not counted), +1 % at 75, +0.8 % at 100
  const out = path.join(b, "both.svg");
  const r = spawnSync(process.execPath, [COMPARE, a, b, "--out", out], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^75\t6\.0000\t6\.0600\t1\.00 %$/m);
  assert.match(r.stdout, /largest difference after step 50: 1\.00 % \(step 75\)/);
  const svg = fs.readFileSync(out, "utf8");
  assert.equal((svg.match(/<polyline class="run"/g) ?? []).length, 2, "one curve per run");
  const none = spawnSync(process.execPath, [COMPARE, a, tmpDir("tstrain-cmp-empty-")], { encoding: "utf8" });
  assert.equal(none.status, 2);
  assert.match(none.stderr, /has no metrics\.jsonl: give the --out folder of a run/);
});
