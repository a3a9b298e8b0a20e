// Temp directories for tests: one helper for every test file (under os.tmpdir(), never the repo).
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

const made: string[] = [];
process.on("exit", () => {
  if (process.env.TSTRAIN_KEEP_TMP) return;
  for (const d of made) {
    try {
      fs.rmSync(d, { recursive: true, force: true });
    } catch {
      /* best effort at exit */
    }
  }
});

/**
 * A fresh directory `tstrain-<tag>-XXXXXX` under os.tmpdir(), removed when the test process exits
 * (set TSTRAIN_KEEP_TMP=1 to keep it for a post-mortem). `tag` may be given with or without the
 * `tstrain-` prefix and a trailing dash.
 */
export function tmpDir(tag: string): string {
  const t = tag.replace(/^tstrain-/, "").replace(/-+$/, "") || "tmp";
  const d = fs.mkdtempSync(path.join(os.tmpdir(), `tstrain-${t}-`));
  made.push(d);
  return d;
}
