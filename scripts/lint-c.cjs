#!/usr/bin/env node
// `npm run lint` (after Biome): the C sources formatted as .clang-format says, checked by clang-format itself
// (`clang-format --dry-run -Werror`): native/**/*.{c,h} and bench/native/*.{c,h}. A line clang-format would change
// fails the lint, naming the file and line. `--write` formats them in place instead (`npm run format`).
//
// Without clang-format the lint refuses (exit 2) with the command that installs it: the check cannot be made, and a
// lint that passed without making it would let a badly formatted file through. The style was set with Debian's
// clang-format 14; another major version may format a few constructs differently, so its version is printed on a
// failure. CLANG_FORMAT names another binary.
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const { spawnSync } = require("node:child_process");

const ROOT = path.join(__dirname, "..");
const DIRS = [
  ["native", true],
  ["bench/native", false],
];

/** The C files to check, relative to root, sorted: [dir, recurse] pairs of DIRS. */
function cFiles(root = ROOT) {
  const out = [];
  const walk = (rel, recurse) => {
    const abs = path.join(root, rel);
    if (!fs.existsSync(abs)) return;
    for (const e of fs.readdirSync(abs, { withFileTypes: true })) {
      const r = path.posix.join(rel, e.name);
      if (e.isDirectory() && recurse) walk(r, true);
      else if (e.isFile() && /\.[ch]$/.test(e.name)) out.push(r);
    }
  };
  for (const [d, recurse] of DIRS) walk(d, recurse);
  return out.sort();
}

function installAdvice() {
  const root = typeof process.getuid === "function" && process.getuid() === 0;
  const sudo = root ? "" : "sudo ";
  return `${sudo}apt-get update && ${sudo}apt-get install -y clang-format`;
}

function main(argv) {
  const write = argv.includes("--write");
  const bin = process.env.CLANG_FORMAT || "clang-format";
  const ver = spawnSync(bin, ["--version"], { encoding: "utf8" });
  if (ver.error || ver.status !== 0) {
    process.stderr.write(
      `lint-c: ${bin} not found (${ver.error ? ver.error.code : `exit ${ver.status}`}); the C format check cannot run. ` +
        `Install it (Debian/Ubuntu): ${installAdvice()}\n`,
    );
    return 2;
  }
  const files = cFiles();
  if (files.length === 0) {
    process.stderr.write(`lint-c: no C files under ${DIRS.map(([d]) => d).join(", ")} in ${ROOT}\n`);
    return 2;
  }
  const args = write ? ["-i", "--style=file", ...files] : ["--dry-run", "-Werror", "--style=file", ...files];
  const r = spawnSync(bin, args, { cwd: ROOT, encoding: "utf8", maxBuffer: 64 << 20 });
  if (r.error) {
    process.stderr.write(`lint-c: ${bin} failed to run: ${r.error.message}\n`);
    return 2;
  }
  if (r.status !== 0) {
    process.stderr.write(r.stderr);
    if (!write)
      process.stderr.write(
        `lint-c: C files not formatted as .clang-format says (${ver.stdout.trim()}); \`npm run format\` formats them\n`,
      );
    return 1;
  }
  process.stdout.write(`C format (${files.length} files, ${ver.stdout.trim()}): ${write ? "formatted" : "clean"}\n`);
  return 0;
}

if (require.main === module) process.exit(main(process.argv.slice(2)));
module.exports = { cFiles, main };
