// Reporting: the loss-curve picture (B5) and the duration format of the progress line.
import { test } from "node:test";
import assert from "node:assert/strict";
import { lossCurveSvg, fmtDuration } from "../src/report";
import type { LogEntry } from "../src/checkpoint";

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
