/** A duration as the progress lines print it: "5s", "2m05s", "1h02m"; "?" for a negative or non-finite one. */
export function fmtDuration(s: number): string {
  if (!Number.isFinite(s) || s < 0) return "?";
  const h = Math.floor(s / 3600),
    m = Math.floor((s % 3600) / 60),
    sec = Math.floor(s % 60);
  return h > 0 ? `${h}h${String(m).padStart(2, "0")}m` : m > 0 ? `${m}m${String(sec).padStart(2, "0")}s` : `${sec}s`;
}
