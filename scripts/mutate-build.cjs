// The build inside Stryker's sandbox: tsc over the instrumented sources (it emits even when the mutants do not
// type-check; exit status ignored, a missing output file fails the run below), then the entry-point launchers.
const { spawnSync } = require("node:child_process");
const fs = require("node:fs");
const path = require("node:path");
spawnSync(process.execPath, [require.resolve("typescript/bin/tsc"), "-p", "tsconfig.json"], { stdio: "ignore" });
if (!fs.existsSync(path.join("dist", "src", "main.js"))) {
  console.error("mutate-build: tsc emitted nothing");
  process.exit(1);
}
require("./entrypoints.cjs");
