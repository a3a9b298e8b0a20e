// The bench's and the tests' probes addon (bench/native-probes.ts, build/Release/tstrain_probes.node): where the
// engine loads and the probes do not, every getter refuses, naming what is wrong and the command that builds them.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { loadNative } from "../src/model/engine/native";
import { loadProbes, PROBES_FILE, probesAt } from "../bench/native-probes";
import { tmpDir } from "./helpers/tmp";

const native = loadNative();
const skip =
  "reason" in native && process.env.TSTRAIN_REQUIRE_NATIVE !== "1"
    ? `native engine unavailable here: ${native.reason}`
    : false;
const FIX = /: npm run build:native \(needs a C compiler, make and python3/;

test("the probes addon loads beside the engine, from build/Release/tstrain_probes.node", { skip }, () => {
  const p = loadProbes();
  assert.ok(p, "loaded");
  assert.equal(path.basename(PROBES_FILE), "tstrain_probes.node");
  assert.ok(p.gemmPeak("avx2", 1000) >= 0);
});

test("a missing, broken or older probes addon is refused, naming it and the command that builds it", { skip }, () => {
  const d = tmpDir("probes-missing");
  const missing = path.join(d, "tstrain_probes.node");
  assert.throws(
    () => probesAt(missing),
    (e: Error) =>
      /^the bench's native probes are not built \(no /.test(e.message) &&
      // the file, named from the working directory or absolute: either way it is the missing one
      path.resolve(/\(no (.+?)\):/.exec(e.message)?.[1] ?? "") === missing &&
      FIX.test(e.message),
  );
  const junk = path.join(d, "junk.node");
  fs.writeFileSync(junk, "not an ELF file");
  assert.throws(
    () => probesAt(junk),
    (e: Error) => /^the bench's native probes do not load \(/.test(e.message) && FIX.test(e.message),
  );
  // the production addon loads, but registers none of the probes
  const engine = path.join(path.dirname(PROBES_FILE), "tstrain_native.node");
  assert.throws(
    () => probesAt(engine),
    (e: Error) =>
      /are older than this checkout \(.*tstrain_native\.node has no attentionProfile/.test(e.message) &&
      FIX.test(e.message),
  );
});
