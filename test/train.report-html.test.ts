// The run report (B5): report.html and loss.svg carry the training loss, the validation points, the LR
// on its own axis, the run summary and the samples, as well-formed, self-contained markup.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { lossCurveSvg, recordSample, writeRunReport } from "../src/report";
import type { LogEntry } from "../src/checkpoint";
import { tmpDir } from "./helpers/tmp";
import { tinyRun } from "./helpers/run";
import { LocalHub } from "../src/hub/server";
import { writeSyntheticMix } from "./helpers/mix";
import { MAIN, runCli, type Child } from "./helpers/survive";

const entry = (step: number, loss: number, lr: number): LogEntry => ({
  step,
  loss,
  lr,
  grad_norm: 1,
  loss_scale: 65536,
  skipped_steps: 0,
  tok_per_s: 1000,
  elapsed_s: step,
});

const VOID = new Set(["meta", "br", "hr", "img", "input", "link"]);
/** Tags balance and nest (HTML void elements and XML self-closing tags aside); returns the tag names seen. */
function checkWellFormed(doc: string): string[] {
  const stack: string[] = [];
  const seen: string[] = [];
  const body = doc.replace(/^<!doctype html>\s*/i, "");
  for (const m of body.matchAll(/<(\/?)([a-zA-Z][a-zA-Z0-9]*)((?:[^>"]|"[^"]*")*?)(\/?)>/g)) {
    const [, close, name, , self] = m;
    const n = name.toLowerCase();
    seen.push(n);
    if (close) {
      const top = stack.pop();
      assert.equal(top, n, `</${n}> closes <${top}> at offset ${m.index}`);
    } else if (!self && !VOID.has(n)) stack.push(n);
  }
  assert.deepEqual(stack, [], "every tag is closed");
  assert.doesNotMatch(body.replace(/<[^>]*>/g, ""), /[<>]/, "no stray < or > in text (all escaped)");
  return seen;
}

test("the chart draws train loss, validation points and the LR on a second axis (B5)", () => {
  const hist = [entry(10, 5, 1e-4), entry(20, 4, 6e-4), entry(30, 3.5, 3e-4)];
  const svg = lossCurveSvg(hist, [{ step: 30, loss: 3.8 }]);
  checkWellFormed(svg);
  const pointsOf = (cls: string) =>
    /points="([^"]+)"/
      .exec(new RegExp(`<polyline class="${cls}"[^>]*>`).exec(svg)![0])![1]
      .split(" ")
      .map((p) => p.split(",").map(Number));
  const train = pointsOf("train"),
    lr = pointsOf("lr");
  assert.equal(train.length, 3);
  assert.equal(lr.length, 3);
  assert.ok(lr[1][1] < lr[0][1] && lr[1][1] < lr[2][1], "the LR peak at step 20 is the highest point of its line");
  const dot = /<circle class="val" cx="([\d.]+)" cy="([\d.]+)"/.exec(svg)!;
  assert.equal(Number(dot[1]), train[2][0], "the val point sits at its step");
  assert.ok(
    Number(dot[2]) < train[2][1] && Number(dot[2]) > train[1][1],
    "3.8 is drawn between 4 and 3.5 on the loss axis",
  );
  assert.match(svg, /6\.0e-4/, "the LR axis is labelled up to the peak LR");
  assert.match(svg, />learning rate \(right axis\)</);
});

test("report.html holds the chart, the run summary figures and the samples, escaped and well-formed (B5)", () => {
  const out = tmpDir("report");
  const hist = [entry(10, 5.25, 1e-4), entry(20, 4.5, 6e-4), entry(30, 3.75, 3e-4)];
  fs.writeFileSync(path.join(out, "metrics.jsonl"), `${hist.map((h) => JSON.stringify(h)).join("\n")}\n{"torn`);
  recordSample(out, { step: 10, prompt: "The", text: " cat <script>alert(1)</script> & dog", decoding: "greedy" });
  recordSample(out, { step: 30, prompt: "The", text: " end of the run\n\n\n\n\nmore", decoding: "greedy" });
  const summary = {
    final_step: 30,
    steps_planned: 30,
    final_loss: 3.75,
    val_loss: 3.9123,
    val_ppl: 50.01,
    tok_per_s: 12345,
    params: 1_400_000,
    backend: "wasm",
    checkpoints: [10, 20, 30],
  };
  const file = writeRunReport(out, summary);
  assert.equal(file, path.join(out, "report.html"));
  const html = fs.readFileSync(file, "utf8");
  const tags = checkWellFormed(html);
  for (const t of ["html", "head", "body", "svg", "polyline", "table", "pre"])
    assert.ok(tags.includes(t), `has <${t}>`);
  assert.doesNotMatch(html, /<script/i, "no script: the sample's markup is escaped");
  assert.match(html, /cat &lt;script&gt;alert\(1\)&lt;\/script&gt; &amp; dog/);
  assert.match(html, /step 10 · greedy/);
  assert.match(html, /<b>The<\/b> end of the run↵×5\nmore<\/pre>/, "a run of newlines is shown as one marked line");
  assert.match(html, /<th>final_loss<\/th><td>3\.75<\/td>/);
  assert.match(html, /<th>val_loss<\/th><td>3\.9123<\/td>/);
  assert.match(html, /<th>tok_per_s<\/th><td>12,345<\/td>/);
  assert.match(html, /<th>checkpoints<\/th><td>\[10,20,30\]<\/td>/);
  assert.match(html, /<title>step 30: val loss 3\.9123<\/title>/, "the final validation loss is a point on the chart");
  assert.match(html, /3 log points, last at step 30 \(train loss 3\.7500\) · 1 validation point/);
  assert.equal(
    fs.readFileSync(path.join(out, "loss.svg"), "utf8").trim(),
    /<svg[\s\S]*<\/svg>/.exec(html)![0],
    "loss.svg is the same chart",
  );
});

/** Every label is a multiple of one round step (1, 2 or 5 x 10^k), evenly spaced. */
function assertRoundTicks(labels: number[], what: string): void {
  assert.ok(labels.length >= 3, `${what}: ${labels.join(", ")}`);
  const step = labels[1] - labels[0];
  const mant = step / 10 ** Math.floor(Math.log10(step) + 1e-9);
  assert.ok(
    [1, 2, 5].some((m) => Math.abs(mant - m) < 1e-6),
    `${what}: step ${step} is not 1, 2 or 5 x 10^k (${labels.join(", ")})`,
  );
  for (let i = 1; i < labels.length; i++)
    assert.ok(Math.abs(labels[i] - labels[i - 1] - step) < step * 1e-6, `${what}: uneven ${labels.join(", ")}`);
  for (const v of labels)
    assert.ok(Math.abs(v / step - Math.round(v / step)) < 1e-6, `${what}: ${v} is not a multiple of ${step}`);
}

test("after a resume the report shows every session (the resumed one marked), the Hub's record with retries, visible whitespace and round ticks (CLI, B5)", {
  timeout: 240_000,
}, async () => {
  const mix = writeSyntheticMix({ vocab: 64, trainTokens: 64 * 1024, valTokens: 1024 });
  const hub = new LocalHub({ dir: tmpDir("report-hub") });
  const url = await hub.start();
  try {
    const out = tmpDir("report-run");
    const args = (extra: string[]) => [
      MAIN,
      ...tinyRun(mix.root, out, [
        "--hub-url",
        url,
        "--hub-repo",
        "me/report",
        "--vocab-size",
        "64",
        "--log-every",
        "1",
        "--backend",
        "wasm",
        ...extra,
      ]),
    ];
    const show = (c: Child) => `exit ${c.code}\n${c.stdout.slice(-3000)}\n${c.stderr.slice(-2000)}`;
    const first = await runCli(args(["--stop-after-steps", "4"]));
    assert.equal(first.code, 0, show(first));
    // A model that answers with spaces only: the report must not show it as an empty box.
    recordSample(out, { step: 4, prompt: "The", text: "   ", decoding: "greedy, 32 tokens" });
    hub.setFaults({ status: { commit: 503 }, failCount: 1 }); // the second session's first commit is retried once
    const second = await runCli(args(["--resume", "auto"]));
    assert.equal(second.code, 0, show(second));
    const html = fs.readFileSync(path.join(out, "report.html"), "utf8");
    checkWellFormed(html);
    const sessions = /<table class="sessions">([\s\S]*?)<\/table>/.exec(html);
    assert.ok(sessions, "a sessions table");
    const rows = [...sessions[1].matchAll(/<tr><td>(.*?)<\/tr>/g)].map((m) =>
      m[1].split("</td><td>").map((c) => c.replace(/<\/?[a-z]+[^>]*>/g, "")),
    );
    assert.equal(rows.length, 2, sessions[1]);
    assert.deepEqual(
      rows.map((r) => r.slice(0, 2)),
      [
        ["1", "0 → 4"],
        ["2", "4 → 8"],
      ],
    );
    assert.equal(rows[0][2], "fresh start");
    assert.match(rows[1][2], /^resumed from \S+checkpoint-4$/);
    assert.deepEqual(
      rows.map((r) => r[3]),
      ["ended at its segment boundary", "completed the run"],
    );
    assert.deepEqual(
      rows.map((r) => r[5]),
      ["4", "8"],
    );
    assert.match(html, /<th>sessions<\/th><td>2 \(resumed 1×\)<\/td>/);
    assert.match(html, /<th>checkpoints \(all sessions\)<\/th><td>\[4,8\]<\/td>/);
    assert.match(html, /<th>session_seconds \(this session\)<\/th>/);
    const hubRows = [
      ...(/<table class="hub">([\s\S]*?)<\/table>/.exec(html)?.[1] ?? "").matchAll(/<tr><td>(.*?)<\/td><\/tr>/g),
    ].map((m) => m[1].split("</td><td>"));
    assert.deepEqual(
      hubRows.map((r) => [r[0], r[1], r[2]]),
      [
        ["1", "ckpt/checkpoint-4", "yes"],
        ["2", "ckpt/checkpoint-8", "yes"],
        ["2", "final", "yes"],
      ],
    );
    for (const r of hubRows) for (const c of [r[3], r[4], r[5]]) assert.match(c, /^\d+\.\d s$/);
    assert.deepEqual(
      hubRows.map((r) => r[6]),
      ["0", "1", "0"],
      "the 503 on checkpoint 8's commit is one retry",
    );
    assert.match(html, /3 publications, 3 verified, 1 retried attempt\(s\), \d+\.\d s verifying\./);
    assert.match(html, /<b>The<\/b><span class="ws">···<\/span><\/pre>/, "spaces only are shown as dots");
    const ticks = (cls: string) =>
      [...html.matchAll(new RegExp(`<text class="${cls}"[^>]*>([^<]+)</text>`, "g"))].map((m) => Number(m[1]));
    assertRoundTicks(ticks("ytick"), "loss axis");
    assertRoundTicks(ticks("xtick"), "step axis");
    assertRoundTicks(ticks("lrtick"), "LR axis");
  } finally {
    hub.clearFaults();
    await hub.stop();
  }
});
