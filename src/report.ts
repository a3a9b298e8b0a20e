/**
 * Run reporting (G5, G9, B5): the log lines, metrics.jsonl, a live progress line on a terminal,
 * and the loss curve as an SVG picture in the run folder.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import type { LogEntry } from "./checkpoint";
import { guardStream, writeOpen } from "./pipes";
import { ProgressRhythm } from "./progress";

export interface Reporter {
  say(line: string): void;
  progress(line: string): void;
  metric(entry: LogEntry): void;
  curve(history: readonly LogEntry[]): void;
}

/** `lines`: no line rewritten in place even on a terminal (under mpirun, whose pty is a terminal to every process). */
export function createReporter(
  outDir: string,
  stream: NodeJS.WriteStream = process.stdout,
  lines = !stream.isTTY,
): Reporter {
  const tty = !lines;
  const rhythm = new ProgressRhythm();
  // O7: a reader that goes away (`| head`) must not end a run: its lines stop, training and metrics.jsonl go on
  guardStream(stream, () =>
    writeOpen(
      process.stderr,
      `note: the output's reader closed it (EPIPE); the run goes on, its log lines in ${path.join(outDir, "metrics.jsonl")}\n`,
    ),
  );
  guardStream(process.stderr);
  const write = (s: string) => writeOpen(stream, s);
  let progressShown = false;
  const clear = () => {
    if (progressShown) {
      write("\r\x1b[2K");
      progressShown = false;
    }
  };
  return {
    say(line: string) {
      clear();
      write(`${line}\n`);
    },
    progress(line: string) {
      if (!tty) {
        // A file or a pipe: no line rewritten in place, but a line at the progress rhythm (progress.ts), ETA included.
        if (!rhythm.due()) return;
        write(`progress: ${line}\n`);
        return;
      }
      write(`\r\x1b[2K${line.slice(0, (stream.columns || 120) - 1)}`);
      progressShown = true;
    },
    metric(entry: LogEntry) {
      fs.mkdirSync(outDir, { recursive: true });
      fs.appendFileSync(path.join(outDir, "metrics.jsonl"), `${JSON.stringify(entry)}\n`);
    },
    curve(history: readonly LogEntry[]) {
      fs.mkdirSync(outDir, { recursive: true });
      fs.writeFileSync(path.join(outDir, "loss.svg"), lossCurveSvg(history));
    },
  };
}

/** A validation point on the chart: the held-out loss at a step. */
export interface ValPoint {
  step: number;
  loss: number;
}

/** An axis of round ticks covering [lo, hi]: a step of 1, 2 or 5 x 10^k (at least `minStep`) giving about `n`
 *  intervals, the axis widened to whole steps; `decimals` is what a label needs to show the step exactly. */
export function niceTicks(
  lo: number,
  hi: number,
  n = 4,
  minStep = 0,
): { lo: number; hi: number; ticks: number[]; decimals: number } {
  const span = hi > lo ? hi - lo : Math.max(Math.abs(hi), 1);
  const raw = span / n;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = Math.max(minStep, [1, 2, 5, 10].map((m) => m * mag).find((x) => x >= raw * (1 - 1e-9))!);
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const a = Math.floor(lo / step + 1e-9) * step;
  const count = Math.max(1, Math.ceil((hi - a) / step - 1e-9));
  const ticks = Array.from({ length: count + 1 }, (_, i) => Number((a + i * step).toFixed(decimals + 2)));
  return { lo: ticks[0], hi: ticks[ticks.length - 1], ticks, decimals };
}

function esc(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

/**
 * A self-contained SVG chart (no dependencies, opens in any browser): the training loss (the mean over
 * each --log-every window) as a blue line, the validation losses as orange dots on the same axis, and
 * the learning rate as a grey dashed line on a second axis at the right.
 */
export function lossCurveSvg(history: readonly LogEntry[], val: readonly ValPoint[] = []): string {
  const W = 720,
    H = 380,
    L = 60,
    R = 72,
    T = 44,
    B = 44;
  const pts = history.filter((h) => Number.isFinite(h.loss));
  const vpts = val.filter((v) => Number.isFinite(v.loss));
  const head =
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="11">` +
    `<rect width="${W}" height="${H}" fill="white"/><text x="${L}" y="18" font-size="13" font-weight="bold">training loss, validation loss and learning rate</text>`;
  if (pts.length === 0) return `${head}<text x="${L}" y="${H / 2}">no finite loss logged yet</text></svg>\n`;
  const steps = [...pts.map((p) => p.step), ...vpts.map((v) => v.step)];
  const xAxis = niceTicks(Math.min(...steps), Math.max(Math.max(...steps), Math.min(...steps) + 1), 5, 1);
  const x0 = xAxis.lo,
    x1 = xAxis.hi;
  const losses = [...pts.map((p) => p.loss), ...vpts.map((v) => v.loss)];
  let lo = Math.min(...losses),
    hi = Math.max(...losses);
  if (hi - lo < 1e-9) {
    lo -= 0.5;
    hi += 0.5;
  }
  const yAxis = niceTicks(lo, hi);
  const y0 = yAxis.lo,
    y1 = yAxis.hi;
  const lrs = pts.map((p) => p.lr).filter((v) => Number.isFinite(v));
  const lrAxis = niceTicks(0, Math.max(1e-12, ...lrs));
  const lrMax = lrAxis.hi;
  const sx = (s: number) => L + ((s - x0) / (x1 - x0)) * (W - L - R);
  const sy = (v: number) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  const sl = (v: number) => T + (1 - v / lrMax) * (H - T - B);
  const poly = pts.map((p) => `${sx(p.step).toFixed(1)},${sy(p.loss).toFixed(1)}`).join(" ");
  const lrPoly = pts
    .filter((p) => Number.isFinite(p.lr))
    .map((p) => `${sx(p.step).toFixed(1)},${sl(p.lr).toFixed(1)}`)
    .join(" ");
  const parts: string[] = [];
  for (const v of yAxis.ticks) {
    parts.push(
      `<line x1="${L}" x2="${W - R}" y1="${sy(v).toFixed(1)}" y2="${sy(v).toFixed(1)}" stroke="#eee"/>` +
        `<text class="ytick" x="${L - 6}" y="${(sy(v) + 4).toFixed(1)}" text-anchor="end">${v.toFixed(yAxis.decimals)}</text>`,
    );
  }
  for (const v of lrAxis.ticks)
    parts.push(
      `<text class="lrtick" x="${W - R + 6}" y="${(sl(v) + 4).toFixed(1)}" fill="#666">${v === 0 ? "0" : v.toExponential(1)}</text>`,
    );
  for (const sv of xAxis.ticks)
    parts.push(`<text class="xtick" x="${sx(sv).toFixed(1)}" y="${H - B + 16}" text-anchor="middle">${sv}</text>`);
  const dots = vpts
    .map(
      (v) =>
        `<circle class="val" cx="${sx(v.step).toFixed(1)}" cy="${sy(v.loss).toFixed(1)}" r="4.5" fill="#ff7f0e" stroke="white"><title>step ${v.step}: val loss ${v.loss.toFixed(4)}</title></circle>`,
    )
    .join("");
  const legend =
    `<g transform="translate(${L + 8},${T - 18})">` +
    `<line x1="0" x2="18" y1="0" y2="0" stroke="#1f77b4" stroke-width="2"/><text x="22" y="4">train loss</text>` +
    `<circle cx="104" cy="0" r="4.5" fill="#ff7f0e"/><text x="112" y="4">val loss</text>` +
    `<line x1="180" x2="198" y1="0" y2="0" stroke="#888" stroke-dasharray="4 3" stroke-width="1.5"/><text x="202" y="4">learning rate (right axis)</text></g>`;
  return (
    head +
    parts.join("") +
    `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="#333"/><line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" stroke="#333"/>` +
    `<line x1="${W - R}" y1="${T}" x2="${W - R}" y2="${H - B}" stroke="#999"/>` +
    `<polyline class="train" fill="none" stroke="#1f77b4" stroke-width="1.8" points="${poly}"/>` +
    (lrPoly
      ? `<polyline class="lr" fill="none" stroke="#888" stroke-dasharray="4 3" stroke-width="1.5" points="${lrPoly}"/>`
      : "") +
    dots +
    legend +
    `<text x="${(L + W - R) / 2}" y="${H - 8}" text-anchor="middle">optimizer step</text>` +
    `<text transform="translate(14,${(T + H - B) / 2}) rotate(-90)" text-anchor="middle">loss (nats/token)</text>` +
    `<text transform="translate(${W - 10},${(T + H - B) / 2}) rotate(90)" text-anchor="middle" fill="#666">learning rate</text></svg>\n`
  );
}

/** A run's logged training losses, for lossCompareSvg. */
export interface CurveRun {
  label: string;
  history: readonly LogEntry[];
}

/**
 * Several runs' training loss curves on one chart (e.g. `--precision fp32` against `bf16`, `node dist/compare.js`):
 * one line per run, in the order given, same axes. Self-contained SVG.
 */
export function lossCompareSvg(runs: readonly CurveRun[]): string {
  const W = 720,
    H = 380,
    L = 60,
    R = 24,
    T = 44,
    B = 44;
  const colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
  const series = runs.map((r) => ({ label: r.label, pts: r.history.filter((h) => Number.isFinite(h.loss)) }));
  const all = series.flatMap((x) => x.pts);
  const head =
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="11">` +
    `<rect width="${W}" height="${H}" fill="white"/><text x="${L}" y="18" font-size="13" font-weight="bold">training loss: ${series.map((x) => esc(x.label)).join(" vs ")}</text>`;
  if (all.length === 0) return `${head}<text x="${L}" y="${H / 2}">no finite loss logged</text></svg>\n`;
  const steps = all.map((p) => p.step);
  const xAxis = niceTicks(Math.min(...steps), Math.max(Math.max(...steps), Math.min(...steps) + 1), 5, 1);
  let lo = Math.min(...all.map((p) => p.loss)),
    hi = Math.max(...all.map((p) => p.loss));
  if (hi - lo < 1e-9) {
    lo -= 0.5;
    hi += 0.5;
  }
  const yAxis = niceTicks(lo, hi);
  const sx = (v: number) => L + ((v - xAxis.lo) / (xAxis.hi - xAxis.lo)) * (W - L - R);
  const sy = (v: number) => T + (1 - (v - yAxis.lo) / (yAxis.hi - yAxis.lo)) * (H - T - B);
  const parts: string[] = [];
  for (const v of yAxis.ticks)
    parts.push(
      `<line x1="${L}" x2="${W - R}" y1="${sy(v).toFixed(1)}" y2="${sy(v).toFixed(1)}" stroke="#eee"/>` +
        `<text class="ytick" x="${L - 6}" y="${(sy(v) + 4).toFixed(1)}" text-anchor="end">${v.toFixed(yAxis.decimals)}</text>`,
    );
  for (const v of xAxis.ticks)
    parts.push(`<text class="xtick" x="${sx(v).toFixed(1)}" y="${H - B + 16}" text-anchor="middle">${v}</text>`);
  series.forEach((x, i) => {
    const c = colors[i % colors.length];
    const dash = i === 0 ? "" : ` stroke-dasharray="${4 + 2 * i} 3"`;
    parts.push(
      `<polyline class="run" fill="none" stroke="${c}" stroke-width="1.8"${dash} points="${x.pts.map((p) => `${sx(p.step).toFixed(1)},${sy(p.loss).toFixed(1)}`).join(" ")}"/>`,
      `<line x1="${L + 8 + 200 * i}" x2="${L + 26 + 200 * i}" y1="${T - 18}" y2="${T - 18}" stroke="${c}" stroke-width="2"${dash}/><text x="${L + 30 + 200 * i}" y="${T - 14}">${esc(x.label)}</text>`,
    );
  });
  return (
    head +
    parts.join("") +
    `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="#333"/><line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" stroke="#333"/>` +
    `<text x="${(L + W - R) / 2}" y="${H - 8}" text-anchor="middle">optimizer step</text>` +
    `<text transform="translate(14,${(T + H - B) / 2}) rotate(-90)" text-anchor="middle">loss (nats/token)</text></svg>\n`
  );
}

/** One generated sample for the report and the log (from a fixed prompt, at a step). */
export interface SampleEntry {
  step: number;
  prompt: string;
  text: string;
  decoding: string;
}

export const SAMPLES_FILE = "samples.jsonl";
export const REPORT_FILE = "report.html";

export function readJsonl<T>(file: string): T[] {
  if (!fs.existsSync(file)) return [];
  const out: T[] = [];
  for (const line of fs.readFileSync(file, "utf8").split("\n")) {
    if (!line.trim()) continue;
    try {
      out.push(JSON.parse(line) as T);
    } catch {
      /* a torn last line of a killed run: skip it */
    }
  }
  return out;
}

/** Appends a sample to <out>/samples.jsonl (read by the report). */
export function recordSample(outDir: string, s: SampleEntry): void {
  fs.mkdirSync(outDir, { recursive: true });
  fs.appendFileSync(path.join(outDir, SAMPLES_FILE), `${JSON.stringify(s)}\n`);
}

/** A sample's newlines shown as "↵" (a run of them as "↵×N") so a model that emits many blank lines stays readable. */
function showNewlines(s: string): string {
  return s.replace(/\n+/g, (m) => (m.length >= 3 ? `↵×${m.length}\n` : "↵\n".repeat(m.length)));
}

/** A sample as HTML with the whitespace a page would hide made visible: tabs as "→", runs of spaces and
 *  trailing spaces (so a sample of spaces only) as "·", newlines as "↵", an empty sample said in words. */
export function showWhitespace(text: string): string {
  if (text.length === 0) return `<span class="ws">(nothing: the model ended the text at once)</span>`;
  const dots = (m: string) => `<span class="ws">${"·".repeat(m.length)}</span>`;
  return showNewlines(
    esc(text)
      .replace(/\t/g, `<span class="ws">→</span>`)
      .replace(/ {2,}/g, dots)
      .replace(/ +(?=\n|$)/g, dots),
  );
}

// ---- the run's sessions and its Hub record (sessions.jsonl) ------------------------------------

export const SESSIONS_FILE = "sessions.jsonl";

/** One Hub publication of a session (K3, K6): where it went, whether it verified, each stage's time, retries. */
export interface HubPublication {
  step: number;
  path: string;
  ok: boolean;
  upload_s: number;
  verify_s: number;
  total_s: number;
  retries: number;
}

/** sessions.jsonl: a "start" line when a session begins training, an "end" line when it ends (none after SIGKILL). */
export type SessionEvent =
  | {
      event: "start";
      session: string;
      at: string;
      start_step: number;
      steps_planned: number;
      resumed_from: string | null;
    }
  | {
      event: "end";
      session: string;
      at: string;
      final_step: number;
      ended: "complete" | "segment" | "stopped" | "failed" | "refused";
      seconds: number;
      checkpoints: number[];
      hub: HubPublication[];
    };

export function recordSessionEvent(outDir: string, e: SessionEvent): void {
  fs.mkdirSync(outDir, { recursive: true });
  fs.appendFileSync(path.join(outDir, SESSIONS_FILE), `${JSON.stringify(e)}\n`);
}

interface SessionRow {
  start: Extract<SessionEvent, { event: "start" }>;
  end: Extract<SessionEvent, { event: "end" }> | null;
}

function sessionRows(outDir: string): SessionRow[] {
  const rows: SessionRow[] = [];
  for (const e of readJsonl<SessionEvent>(path.join(outDir, SESSIONS_FILE))) {
    if (e.event === "start") rows.push({ start: e, end: null });
    else {
      const r = rows.find((x) => x.start.session === e.session);
      if (r) r.end = e;
    }
  }
  return rows;
}

const ENDED: Record<string, string> = {
  complete: "completed the run",
  segment: "ended at its segment boundary",
  stopped: "stopped by a signal",
  failed: "stopped: a checkpoint failed",
  refused: "refused before its first step",
};

/** The sessions table (every session, a resumed one marked) and the Hub's record, for report.html. */
function sessionsHtml(rows: SessionRow[]): { sessions: string; hub: string; totals: Record<string, unknown> } {
  if (rows.length === 0) return { sessions: "", hub: "", totals: {} };
  const tr = (cells: string[]) => `<tr>${cells.map((c) => `<td>${c}</td>`).join("")}</tr>`;
  const sessions =
    `<table class="sessions"><tr><th>#</th><th>steps</th><th>start</th><th>how it ended</th><th>time</th><th>checkpoints</th></tr>\n` +
    rows
      .map((r, i) =>
        tr([
          String(i + 1),
          `${r.start.start_step} → ${r.end ? r.end.final_step : "?"}`,
          r.start.resumed_from ? `<b>resumed</b> from ${esc(r.start.resumed_from)}` : "fresh start",
          r.end ? esc(ENDED[r.end.ended] ?? r.end.ended) : "no end record (killed or crashed)",
          r.end ? `${fmtValue(r.end.seconds)} s` : "–",
          r.end ? esc(r.end.checkpoints.join(", ") || "none") : "–",
        ]),
      )
      .join("\n") +
    "</table>";
  const pubs = rows.flatMap((r, i) => (r.end?.hub ?? []).map((h) => ({ ...h, session: i + 1 })));
  const hub =
    pubs.length === 0
      ? "<p>Nothing was published to a Hub.</p>"
      : `<table class="hub"><tr><th>session</th><th>folder</th><th>verified</th><th>upload</th><th>verify</th><th>total</th><th>retries</th></tr>\n` +
        pubs
          .map((h) =>
            tr([
              String(h.session),
              esc(h.path),
              h.ok ? "yes" : "<b>no</b>",
              `${h.upload_s.toFixed(1)} s`,
              `${h.verify_s.toFixed(1)} s`,
              `${h.total_s.toFixed(1)} s`,
              String(h.retries),
            ]),
          )
          .join("\n") +
        "</table>" +
        `<p>${pubs.length} publication${pubs.length > 1 ? "s" : ""}, ${pubs.filter((h) => h.ok).length} verified, ${pubs.reduce((a, h) => a + h.retries, 0)} retried attempt(s), ${pubs.reduce((a, h) => a + h.verify_s, 0).toFixed(1)} s verifying.</p>`;
  const ended = rows.filter((r) => r.end);
  const totals = {
    sessions: `${rows.length}${rows.length > 1 ? ` (resumed ${rows.length - 1}×)` : ""}`,
    "run_seconds (all sessions)": Math.round(ended.reduce((a, r) => a + r.end!.seconds, 0) * 10) / 10,
    "checkpoints (all sessions)": [...new Set(ended.flatMap((r) => r.end!.checkpoints))].sort((a, b) => a - b),
  };
  return { sessions, hub, totals };
}

function fmtValue(v: unknown): string {
  if (typeof v === "number")
    return Number.isInteger(v)
      ? v.toLocaleString("en-US")
      : Math.abs(v) < 1e-3 && v !== 0
        ? v.toExponential(3)
        : String(Number(v.toFixed(4)));
  if (v === null || v === undefined) return "–";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

/**
 * The run folder's one-page report (B5): the chart (train loss, val points, LR), the run summary
 * (the RUN_JSON figures) and the samples. Self-contained HTML: no scripts, no external files.
 * Reads metrics.jsonl and samples.jsonl from outDir; rewrites loss.svg with the val points too.
 * Returns the report's path.
 */
export function writeRunReport(outDir: string, summary: Record<string, unknown>): string {
  const history = readJsonl<LogEntry & { val_loss?: number }>(path.join(outDir, "metrics.jsonl"));
  const val: ValPoint[] = history
    .filter((h) => typeof h.val_loss === "number")
    .map((h) => ({ step: h.step, loss: h.val_loss! }));
  if (
    typeof summary.val_loss === "number" &&
    typeof summary.final_step === "number" &&
    !val.some((v) => v.step === summary.final_step)
  ) {
    val.push({ step: summary.final_step, loss: summary.val_loss });
  }
  const svg = lossCurveSvg(history, val);
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, "loss.svg"), svg);
  const samples = readJsonl<SampleEntry>(path.join(outDir, SAMPLES_FILE));
  const runs = sessionsHtml(sessionRows(outDir));
  const keys = [
    "final_step",
    "steps_planned",
    "final_loss",
    "val_loss",
    "val_ppl",
    "tokens_consumed",
    "tok_per_s",
    "session_seconds",
    "params",
    "world",
    "micro_batch",
    "accum",
    "seq_len",
    "backend",
    "skipped_steps",
    "loss_scale",
    "checkpoints",
    "exported",
  ];
  const label = (k: string) =>
    (k === "session_seconds" || k === "checkpoints") && runs.sessions ? `${k} (this session)` : k;
  const all: Record<string, unknown> = { ...summary, ...runs.totals };
  const rows = [...keys, ...Object.keys(runs.totals)]
    .filter((k) => k in all)
    .map((k) => `<tr><th>${esc(label(k))}</th><td>${esc(fmtValue(all[k]))}</td></tr>`)
    .join("\n");
  const sampleHtml =
    samples.length === 0
      ? "<p>No samples were logged (sampling off, or no checkpoint yet).</p>"
      : samples
          .map(
            (s) =>
              `<div class="sample"><div class="meta">step ${s.step} · ${esc(s.decoding)}</div><pre><b>${esc(s.prompt)}</b>${showWhitespace(s.text)}</pre></div>`,
          )
          .join("\n");
  const last = history[history.length - 1];
  const html = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tstrain run report</title>
<style>
body { font-family: sans-serif; max-width: 760px; margin: 24px auto; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 13px; } th, td { text-align: left; padding: 3px 12px 3px 0; border-bottom: 1px solid #eee; }
th { font-weight: normal; color: #555; }
.sample { margin: 10px 0; } .meta { font-size: 12px; color: #666; } .ws { color: #aaa; }
pre { white-space: pre-wrap; background: #f7f7f7; padding: 8px; border-radius: 4px; font-size: 13px; max-height: 9em; overflow: auto; }
</style></head>
<body>
<h1>tstrain run report</h1>
<p>${esc(path.resolve(outDir))} · ${history.length} log points${last ? `, last at step ${last.step} (train loss ${last.loss.toFixed(4)})` : ""}${val.length ? ` · ${val.length} validation point${val.length > 1 ? "s" : ""}` : ""}</p>
<h2>Loss</h2>
${svg.trim()}
<h2>Run summary</h2>
<table>
${rows}
</table>
${runs.sessions ? `<h2>Sessions</h2>\n${runs.sessions}\n<h2>Hub</h2>\n${runs.hub}\n` : ""}<h2>Samples</h2>
${sampleHtml}
</body></html>
`;
  const file = path.join(outDir, REPORT_FILE);
  fs.writeFileSync(file, html);
  return file;
}
