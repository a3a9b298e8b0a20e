#!/usr/bin/env node
// npm run mutate -- [MODULE[:LINES] ...]   (no argument: every module below, one after the other)
// LINES restricts the mutants to line ranges of the module, e.g. src/actors/coordinator.ts:135-247,288-305.
// Mutation testing with StrykerJS over node's test runner (tap runner), one module at a time, against the test
// files that exercise it; prints a mutation score per module. Slow by nature: not part of `npm test`.
// Env: STRYKER_CONCURRENCY (default 2), STRYKER_TSC=1 adds the TypeScript checker.
const { spawnSync } = require("node:child_process");
const fs = require("node:fs");
const path = require("node:path");

const T = (...names) => names.map((n) => `dist/test/${n}.test.js`);
/** module -> the test files that exercise it */
const MODULES = {
  "src/optim/optim.ts": T("train.optim", "train.step-decision", "train.runtime"),
  "src/optim/optim-simd.ts": T("train.optim", "train.runtime"),
  "src/actors/coordinator.ts": T(
    "train.rank-handle",
    "train.coordinator-uploader",
    "train.step-decision",
    "train.runtime",
    "train.coordinator",
  ),
  "src/data/permutation.ts": T("data.permutation", "data.sampler"),
  "src/data/sampler.ts": T("data.sampler", "data.guards"),
  "src/data/cursor.ts": T("data.cursor", "data.guards", "data.sampler", "checkpoint.manager"),
  "src/data/budget.ts": T("data.budget", "data.guards", "data.sampler", "train.config"),
  "src/config.ts": T("train.config", "data.guards"),
  "src/hub/resume.ts": T("hub.resume"),
  "src/hub/cycle.ts": T("hub.cycle"),
  "src/checkpoint/names.ts": T("checkpoint.names", "checkpoint.write"),
  "src/checkpoint/state.ts": T("checkpoint.state", "checkpoint.write", "checkpoint.manager"),
  "src/checkpoint/manager.ts": T("checkpoint.manager"),
  "src/optim/optim-state.ts": T("checkpoint.manager", "checkpoint.state"),
  "src/checkpoint/save.ts": T("checkpoint.write"),
  "src/checkpoint/load.ts": T("checkpoint.write", "checkpoint.state"),
};

const root = path.join(__dirname, "..");
const args = process.argv.slice(2);
const wanted = args.length ? args : Object.keys(MODULES);
const file = (m) => m.replace(/:.*$/, "");
/** "file:a-b,c-d" -> Stryker's mutate entries "file:a-b", "file:c-d" (or just "file"). */
const mutateEntries = (m) =>
  m.includes(":")
    ? m
        .slice(m.indexOf(":") + 1)
        .split(",")
        .map((r) => `${file(m)}:${r}`)
    : [m];
for (const m of wanted)
  if (!MODULES[file(m)] || !/^[^:]+(:\d+-\d+(,\d+-\d+)*)?$/.test(m)) {
    console.error(`mutate: unknown module ${m}; known: ${Object.keys(MODULES).join(", ")}`);
    process.exit(2);
  }

const rows = [];
for (const m of wanted) {
  const tests = MODULES[file(m)].filter((f) =>
    fs.existsSync(path.join(root, f.replace(/^dist\/test\/(.*)\.js$/, "test/$1.ts"))),
  );
  console.log(`\n=== ${m}: mutants run against ${tests.join(", ")}`);
  const t0 = Date.now();
  const r = spawnSync(
    process.execPath,
    [
      path.join(path.dirname(require.resolve("@stryker-mutator/core/package.json")), "bin", "stryker.js"),
      "run",
      "stryker.config.mjs",
    ],
    {
      cwd: root,
      stdio: "inherit",
      env: { ...process.env, STRYKER_MUTATE: mutateEntries(m).join(","), STRYKER_TESTS: tests.join(",") },
    },
  );
  const report = path.join(root, "reports", "mutation", `${file(m).replace(/[/.]/g, "_")}.json`);
  if (r.status !== 0 || !fs.existsSync(report)) {
    rows.push({ m, error: `stryker exited ${r.status}` });
    continue;
  }
  const j = JSON.parse(fs.readFileSync(report, "utf8"));
  const c = {};
  for (const f of Object.values(j.files)) for (const mu of f.mutants) c[mu.status] = (c[mu.status] ?? 0) + 1;
  const killed = (c.Killed ?? 0) + (c.Timeout ?? 0);
  const valid = killed + (c.Survived ?? 0) + (c.NoCoverage ?? 0);
  rows.push({
    m,
    killed,
    survived: c.Survived ?? 0,
    noCov: c.NoCoverage ?? 0,
    invalid: (c.CompileError ?? 0) + (c.RuntimeError ?? 0),
    score: valid ? (100 * killed) / valid : NaN,
    min: (Date.now() - t0) / 60000,
  });
}
console.log(
  "\n| module | killed (incl. timeout) | survived | no coverage | compile/runtime errors | score | minutes |",
);
console.log("|---|---|---|---|---|---|---|");
for (const x of rows) {
  if (x.error) console.log(`| ${x.m} | ${x.error} | | | | | |`);
  else
    console.log(
      `| ${x.m} | ${x.killed} | ${x.survived} | ${x.noCov} | ${x.invalid} | ${x.score.toFixed(1)} % | ${x.min.toFixed(1)} |`,
    );
}
