// The attention bench's base (`--attention-base DIR`, built by bench/native/build-base.sh): every refusal names the
// folder and the rule before any timing, and its advice is a command that works from a fresh folder.
import { test } from "node:test";
import { spawnSync } from "node:child_process";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { loadBaseAttention } from "../bench/attention";
import { loadNative } from "../src/model/engine/native";
import { tmpDir } from "./helpers/tmp";

const ROOT = path.join(__dirname, "..", "..");
const SCRIPT = path.join(ROOT, "bench", "native", "build-base.sh");
const native = loadNative();
const skip =
  "reason" in native && process.env.TSTRAIN_REQUIRE_NATIVE !== "1"
    ? `native engine unavailable here: ${native.reason}`
    : false;
const ADVICE = /build a base with `bench\/native\/build-base\.sh 2babbe7 "\$\(mktemp -d\)"`/;

test("--attention-base: a folder without a build is refused, naming the addon it looked for and the build command", () => {
  const d = tmpDir("att-base-empty");
  assert.throws(
    () => loadBaseAttention(d),
    (e: Error) =>
      e.message.includes(JSON.stringify(d)) &&
      e.message.includes(path.join(d, "build", "Release", "tstrain_native.node")) &&
      ADVICE.test(e.message),
  );
});

test("--attention-base: this tree's own build (the fused kernels) is refused as no base", { skip }, () => {
  assert.throws(
    () => loadBaseAttention(ROOT),
    (e: Error) => /has no unfused attentionForward/.test(e.message) && ADVICE.test(e.message),
  );
});

test("build-base.sh refuses a revision that is no commit and a folder that is not empty, changing nothing", () => {
  const d = tmpDir("att-base-full");
  fs.writeFileSync(path.join(d, "keep"), "mine");
  const notRev = spawnSync("bash", [SCRIPT, "no-such-revision-x", tmpDir("att-base-new")], {
    cwd: ROOT,
    encoding: "utf8",
  });
  assert.equal(notRev.status, 2, notRev.stderr);
  assert.match(notRev.stderr, /no-such-revision-x is not a commit of this clone/);
  const full = spawnSync("bash", [SCRIPT, "HEAD", d], { cwd: ROOT, encoding: "utf8" });
  assert.equal(full.status, 2, full.stderr);
  assert.match(full.stderr, new RegExp(`${d.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")} exists and is not empty`));
  assert.deepEqual(fs.readdirSync(d), ["keep"]);
  assert.equal(fs.readFileSync(path.join(d, "keep"), "utf8"), "mine");
});
