/**
 * Run reporting (G5, G9, B5): the log lines, metrics.jsonl, a live progress line on a terminal,
 * and the loss curve as an SVG picture in the run folder.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import type { LogEntry } from "./checkpoint";

export interface Reporter {
  say(line: string): void;
  progress(line: string): void;
  metric(entry: LogEntry): void;
  curve(history: readonly LogEntry[]): void;
}

export function createReporter(outDir: string, stream: NodeJS.WriteStream = process.stdout): Reporter {
  const tty = Boolean(stream.isTTY);
  let progressShown = false;
  const clear = () => {
    if (progressShown) { stream.write("\r\x1b[2K"); progressShown = false; }
  };
  return {
    say(line: string) {
      clear();
      stream.write(line + "\n");
    },
    progress(line: string) {
      if (!tty) return;
      stream.write("\r\x1b[2K" + line.slice(0, (stream.columns || 120) - 1));
      progressShown = true;
    },
    metric(entry: LogEntry) {
      fs.mkdirSync(outDir, { recursive: true });
      fs.appendFileSync(path.join(outDir, "metrics.jsonl"), JSON.stringify(entry) + "\n");
    },
    curve(history: readonly LogEntry[]) {
      fs.mkdirSync(outDir, { recursive: true });
      fs.writeFileSync(path.join(outDir, "loss.svg"), lossCurveSvg(history));
    },
  };
}

/** A self-contained SVG line chart of loss against step (no dependencies, opens in any browser). */
export function lossCurveSvg(history: readonly LogEntry[]): string {
  const W = 640, H = 360, L = 56, R = 16, T = 28, B = 40;
  const pts = history.filter((h) => Number.isFinite(h.loss));
  const head = `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="11">` +
    `<rect width="${W}" height="${H}" fill="white"/><text x="${L}" y="18" font-size="13">training loss</text>`;
  if (pts.length === 0) return head + `<text x="${L}" y="${H / 2}">no finite loss logged yet</text></svg>\n`;
  const x0 = pts[0]!.step, x1 = Math.max(pts[pts.length - 1]!.step, x0 + 1);
  let y0 = Math.min(...pts.map((p) => p.loss)), y1 = Math.max(...pts.map((p) => p.loss));
  if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
  const sx = (s: number) => L + ((s - x0) / (x1 - x0)) * (W - L - R);
  const sy = (v: number) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  const poly = pts.map((p) => `${sx(p.step).toFixed(1)},${sy(p.loss).toFixed(1)}`).join(" ");
  const ticks: string[] = [];
  for (let i = 0; i <= 4; i++) {
    const v = y0 + ((y1 - y0) * i) / 4;
    ticks.push(`<line x1="${L}" x2="${W - R}" y1="${sy(v).toFixed(1)}" y2="${sy(v).toFixed(1)}" stroke="#eee"/>` +
      `<text x="${L - 6}" y="${(sy(v) + 4).toFixed(1)}" text-anchor="end">${v.toFixed(3)}</text>`);
    const s = Math.round(x0 + ((x1 - x0) * i) / 4);
    ticks.push(`<text x="${sx(s).toFixed(1)}" y="${H - B + 16}" text-anchor="middle">${s}</text>`);
  }
  return head + ticks.join("") +
    `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="#333"/><line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" stroke="#333"/>` +
    `<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="${poly}"/>` +
    `<text x="${(L + W - R) / 2}" y="${H - 6}" text-anchor="middle">step</text></svg>\n`;
}

export function fmtDuration(s: number): string {
  if (!Number.isFinite(s) || s < 0) return "?";
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = Math.floor(s % 60);
  return h > 0 ? `${h}h${String(m).padStart(2, "0")}m` : m > 0 ? `${m}m${String(sec).padStart(2, "0")}s` : `${sec}s`;
}
