// The run folder: checked before step 1 (O1), claimed with a lock (O2), cleaned (O4), and a full
// disk (O5) on a real 20 MB tmpfs. Real CLI runs; the Hub is the real local Hub.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { LocalHub } from "../src/hub/server";
import { createHubClient } from "../src/hub/client";
import { writeSyntheticMix } from "./helpers/mix";
import { tmpDir } from "./helpers/tmp";
import { tinyRun } from "./helpers/run";
import { MAIN, adviceAfter, modelBytes, runCli, type Child } from "./helpers/survive";
import { createHash } from "node:crypto";
import { parseManifest } from "../src/checkpoint";

const mix = writeSyntheticMix({ vocab: 64, trainTokens: 64 * 1024, valTokens: 1024 });
const show = (c: Child) =>
  `exit ${c.code} ${c.signal ?? ""}\n--- stdout\n${c.stdout.slice(-4000)}\n--- stderr\n${c.stderr.slice(-3000)}`;

/** Small model (22k parameters) unless `model` overrides --hidden / --vocab-size. */
function args(out: string, extra: string[] = [], model: string[] = ["--hidden", "36", "--vocab-size", "64"]): string[] {
  return [MAIN, ...tinyRun(mix.root, out, [...model, "--backend", "wasm", ...extra])];
}

let hub: LocalHub;
let url: string;
before(async () => {
  hub = new LocalHub({ dir: tmpDir("tstrain-out-hub-") });
  url = await hub.start();
});
after(async () => {
  await hub.stop();
});

// ---- tmpfs: a real small filesystem, mounted by the test and unmounted afterwards ---------------

interface Mount {
  dir: string;
  umount(): void;
}

/** Mounts a tmpfs of `size` (e.g. "20m", options like "ro") at a new temp dir, or says why it cannot. */
function mountTmpfs(size: string, extra = ""): Mount | string {
  const dir = tmpDir("tstrain-tmpfs-");
  const r = spawnSync("mount", ["-t", "tmpfs", "-o", `size=${size}${extra ? `,${extra}` : ""}`, "tmpfs", dir], {
    encoding: "utf8",
  });
  if (r.status !== 0) {
    fs.rmSync(dir, { recursive: true, force: true });
    return `mount -t tmpfs failed (${r.error?.message ?? ((r.stderr || "").trim() || `exit ${r.status}`)}); running as uid ${process.getuid?.()}`;
  }
  return {
    dir,
    umount() {
      spawnSync("umount", [dir]);
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A mount or, when mounting is impossible: a failure under TSTRAIN_REQUIRE_TMPFS=1, else null (the caller emulates). */
function tmpfsOrWhy(size: string, extra = ""): { m: Mount | null; why: string | null } {
  const m = mountTmpfs(size, extra);
  if (typeof m !== "string") return { m, why: null };
  if (process.env.TSTRAIN_REQUIRE_TMPFS === "1")
    assert.fail(`TSTRAIN_REQUIRE_TMPFS=1 but no tmpfs could be mounted: ${m}`);
  return { m: null, why: m };
}

test("--out that is a file: refused before step 1, exit 2, naming the path and O1", { timeout: 60_000 }, async () => {
  const f = path.join(tmpDir("tstrain-outfile-"), "run");
  fs.writeFileSync(f, "not a folder");
  const r = await runCli(args(f));
  assert.equal(r.code, 2, show(r));
  assert.match(
    r.stderr,
    new RegExp(`--out ${f.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} is a file, not a folder.*\\[O1\\]`),
  );
  assert.doesNotMatch(r.stdout, /step 1\//);
});

test("--out on a read-only filesystem: refused before step 1, exit 2, naming the path and O1", {
  timeout: 60_000,
}, async (t) => {
  const { m, why } = tmpfsOrWhy("1m", "ro");
  let out: string;
  let cleanup: () => void;
  if (m) {
    out = path.join(m.dir, "run");
    cleanup = () => m.umount();
  } else {
    // Emulation (said): a folder without write permission, which refuses writes for a non-root user.
    if (process.getuid?.() === 0) {
      t.diagnostic(`cannot emulate read-only as root without a mount: ${why}`);
      assert.fail(`no read-only filesystem available: ${why}`);
    }
    const d = tmpDir("tstrain-ro-");
    fs.chmodSync(d, 0o555);
    out = path.join(d, "run");
    cleanup = () => fs.chmodSync(d, 0o755);
    t.diagnostic(`emulating a read-only place with a mode-555 folder: ${why}`);
  }
  try {
    const r = await runCli(args(out));
    assert.equal(r.code, 2, show(r));
    assert.match(
      r.stderr,
      new RegExp(
        `--out ${out.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} cannot be created: it is on a read-only filesystem \\(EROFS\\)|cannot be created: this user may not write`,
      ),
    );
    assert.match(r.stderr, /\[O1\]/);
    assert.doesNotMatch(r.stdout, /step 1\//);
  } finally {
    cleanup();
  }
});

test("a second run on a locked --out is refused before step 1 (exit 2, O2); a stale lock is taken over, and leftovers are cleaned (O4)", {
  timeout: 120_000,
}, async () => {
  const out = tmpDir("tstrain-lock-");
  // A live holder: this test process.
  fs.writeFileSync(
    path.join(out, ".tstrain.lock"),
    JSON.stringify({ pid: process.pid, host: os.hostname(), started: "earlier", argv: [] }),
  );
  const r = await runCli(args(out));
  assert.equal(r.code, 2, show(r));
  assert.match(
    r.stderr,
    new RegExp(
      `--out ${out.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} is in use by another run \\(pid ${process.pid} on ${os.hostname()}.*\\[O2\\]`,
    ),
  );
  assert.doesNotMatch(r.stdout, /step 1\//);
  assert.ok(fs.existsSync(path.join(out, ".tstrain.lock")), "the live run's lock is left alone");

  // A dead holder: a process that has exited.
  const dead = spawnSync(process.execPath, ["-e", "process.stdout.write(String(process.pid))"], { encoding: "utf8" });
  const deadPid = Number(dead.stdout);
  fs.writeFileSync(
    path.join(out, ".tstrain.lock"),
    JSON.stringify({ pid: deadPid, host: os.hostname(), started: "earlier", argv: [] }),
  );
  fs.mkdirSync(path.join(out, "ckpt", "checkpoint-4.partial-999999"), { recursive: true });
  fs.writeFileSync(path.join(out, "ckpt", "checkpoint-4.partial-999999", "model.safetensors"), "half");
  for (const t of [1000, 2000, 3000])
    fs.mkdirSync(path.join(out, "ckpt", `checkpoint-12.superseded-${t}`), { recursive: true });
  const ok = await runCli(args(out, ["--max-steps", "4"]));
  assert.equal(ok.code, 0, show(ok));
  assert.match(ok.stdout, new RegExp(`taking over a stale lock \\(pid ${deadPid} on ${os.hostname()} is not running`));
  assert.match(ok.stdout, /removed .*checkpoint-4\.partial-999999: left by an interrupted write \(O4\)/);
  assert.deepEqual(fs.readdirSync(path.join(out, "ckpt")).sort(), ["checkpoint-12.superseded-3000", "checkpoint-4"]);
  assert.ok(!fs.existsSync(path.join(out, ".tstrain.lock")), "released at exit");
});

test("a 20 MB tmpfs as --out: refused before step 1 when one checkpoint cannot fit; with room for one but not two, ENOSPC leaves no partial folder and the advised --resume auto completes bit-identically (O1, O5, R6)", {
  timeout: 300_000,
}, async (t) => {
  const { m, why } = tmpfsOrWhy("20m");
  if (!m) {
    // Honest fallback: without a mount there is no full disk to meet. Say so, and fail under TSTRAIN_REQUIRE_TMPFS=1 (above).
    t.diagnostic(`no tmpfs: ${why}; the full-disk cases need a real small filesystem and were not run`);
    t.skip(`no tmpfs could be mounted: ${why}`);
    return;
  }
  try {
    // 2.95M parameters: one checkpoint is ~35 MB > 20 MB.
    const big = await runCli(args(path.join(m.dir, "big"), [], ["--hidden", "288", "--vocab-size", "4096"]));
    assert.equal(big.code, 2, show(big));
    assert.match(
      big.stderr,
      /--out .*\/big has [\d.]+ MB free but one checkpoint of 2,9\d\d,\d{3} parameters .* takes about 3\d\.\d MB.*\[O1\]/,
    );
    assert.doesNotMatch(big.stdout, /step 1\//);

    // 1.03M parameters: one checkpoint is ~12.4 MB; a second does not fit beside it.
    const model = ["--hidden", "144", "--vocab-size", "4096"];
    const repo = "me/tmpfs";
    const ref = tmpDir("tstrain-tmpfs-ref-");
    const straight = await runCli(args(ref, ["--hub-url", url, "--hub-repo", "me/tmpfs-ref"], model));
    assert.equal(straight.code, 0, show(straight));

    const out = path.join(m.dir, "run");
    const r = await runCli(args(out, ["--hub-url", url, "--hub-repo", repo], model));
    assert.equal(r.code, 2, show(r));
    assert.match(r.stdout, /^CKPT 4 .*ok=true/m);
    assert.match(
      r.stderr,
      /writing checkpoint folder .*checkpoint-8 failed: the disk is full \(ENOSPC\); the partial folder was removed\. Training stopped at step 8; checkpoint 4 is verified on the Hub.*\[O5\]/,
    );
    assert.deepEqual(fs.readdirSync(path.join(out, "ckpt")), ["checkpoint-4"], "no partial folder left");
    assert.equal((await createHubClient({ hubUrl: url, repo, repoType: "dataset" }).readPointer())?.step, 4);

    const again = await runCli(adviceAfter(r.stderr, /then continue with:/));
    assert.equal(again.code, 0, show(again));
    assert.match(
      again.stdout,
      /reusing the local copy .*checkpoint-4: its 7 files match the Hub's sizes and hashes .* nothing is downloaded \(R6\)/,
    );
    assert.match(
      again.stdout,
      /disk: removed local checkpoint-4 \(verified on the Hub\) to make room for checkpoint 8 \(--prune\)/,
    );
    assert.ok(modelBytes(path.join(out, "final")).equals(modelBytes(path.join(ref, "final"))), "bit-identical");
    assert.ok(!fs.readdirSync(path.join(out, "ckpt")).some((n) => n.includes(".partial-")));
  } finally {
    m.umount();
  }
});

// ---- K2: a checkpoint folder never appears under its final name without its complete manifest -----

const CKPT_FAULT = path.join(__dirname, "helpers", "ckpt-fault.js");

/** Every ckpt/checkpoint-N folder holds a manifest.json listing every other file in it, sizes and sha256 right. */
function assertEveryCheckpointComplete(out: string, what: string): string[] {
  const names = fs.readdirSync(path.join(out, "ckpt")).sort();
  for (const name of names.filter((n) => /^checkpoint-\d+$/.test(n))) {
    const dir = path.join(out, "ckpt", name);
    assert.ok(fs.existsSync(path.join(dir, "manifest.json")), `${what}: ${name} has no manifest.json`);
    const m = parseManifest(fs.readFileSync(path.join(dir, "manifest.json")), `${name}/manifest.json`);
    assert.deepEqual(
      fs
        .readdirSync(dir)
        .filter((f) => f !== "manifest.json")
        .sort(),
      Object.keys(m.files).sort(),
      `${what}: ${name}'s files are the manifest's`,
    );
    for (const [f, e] of Object.entries(m.files)) {
      const b = fs.readFileSync(path.join(dir, f));
      assert.deepEqual(
        { size: b.length, sha256: createHash("sha256").update(b).digest("hex") },
        e,
        `${what}: ${name}/${f}`,
      );
    }
  }
  return names;
}

for (const mode of ["manifest-fails", "die-in-manifest", "die-before-rename"] as const) {
  test(`checkpoint 8's write struck (${mode}): no checkpoint-8 folder without its complete manifest; a rerun from checkpoint 4 clears what is left and completes (K2, O4)`, {
    timeout: 180_000,
  }, async () => {
    const out = tmpDir("tstrain-manifest-");
    const r = await runCli(["--require", CKPT_FAULT, ...args(out)], { env: { TSTRAIN_TEST_CKPT_FAULT: `${mode}:8` } });
    if (mode === "manifest-fails") {
      assert.equal(r.code, 2, show(r));
      assert.match(
        r.stderr,
        /writing checkpoint folder .*checkpoint-8 failed: EIO .*injected.*; the partial folder was removed/,
      );
    } else {
      assert.equal(r.signal, "SIGKILL", show(r));
    }
    assert.match(r.stdout, /^CKPT 4 /m, show(r));
    const names = assertEveryCheckpointComplete(out, mode);
    assert.ok(names.includes("checkpoint-4"), names.join(", "));
    assert.ok(!names.includes("checkpoint-8"), `${mode}: checkpoint-8 appeared: ${names.join(", ")}`);
    if (mode === "manifest-fails") assert.deepEqual(names, ["checkpoint-4"], "the partial folder was removed");

    const again = await runCli(args(out, ["--resume", path.join(out, "ckpt", "checkpoint-4")]));
    assert.equal(again.code, 0, show(again));
    if (mode !== "manifest-fails")
      assert.match(again.stdout, /removed .*checkpoint-8\.partial-\d+: left by an interrupted write \(O4\)/);
    const after = assertEveryCheckpointComplete(out, `${mode}, rerun`);
    assert.ok(after.includes("checkpoint-8") && !after.some((n) => n.includes(".partial-")), after.join(", "));
  });
}

test("a slow checkpoint write makes the ranks wait: the first wait says why and how long, each later one is one short line with its time (K1, B5)", {
  timeout: 180_000,
}, async () => {
  const out = tmpDir("tstrain-slow-write-");
  const r = await runCli(["--require", CKPT_FAULT, ...args(out, ["--push-every-steps", "2"])], {
    env: { TSTRAIN_TEST_CKPT_FAULT: "slow-write:1500" },
  });
  assert.equal(r.code, 0, show(r));
  const waits = r.stdout.split("\n").filter((l) => /the ranks waited/.test(l));
  assert.ok(waits.length >= 2, show(r));
  assert.match(
    waits[0],
    /^checkpoint \d+: the ranks waited \d+\.\ds for checkpoint \d+ to be written: the weights are copied into one staging buffer, which is free again only once the previous folder is on disk/,
  );
  for (const l of waits.slice(1))
    assert.match(l, /^checkpoint \d+: the ranks waited \d+\.\ds for the previous checkpoint's write$/);
  assert.ok(
    waits.every((l) => Number(/waited (\d+\.\d)s/.exec(l)![1]) > 0),
    waits.join("\n"),
  );
  assert.doesNotMatch(r.stdout, /waiting for checkpoint \d+ to be written/);
});
