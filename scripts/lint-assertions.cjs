#!/usr/bin/env node
// `npm run lint` (after Biome): non-null assertions (`x!`) on values whose type cannot be null or undefined.
// Such a `!` asserts nothing and hides which of the remaining ones do (a Map lookup, a regex group, an
// optional field the code has ruled out). Read with the TypeScript type checker over tsconfig.json's files.
//
// Why `noUncheckedIndexedAccess` stays off: the model, optimizer and data code index typed arrays in
// every inner loop; with the flag each of those reads would need a check or a `!`, which is the noise this
// script removes. Indexing stays unchecked, and a `!` must mean something.
//
// `node scripts/lint-assertions.cjs` lists them and exits 1; `--fix` removes them.
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const ts = require("typescript");

const ROOT = path.join(__dirname, "..");

/** Every needless `!` in the project: {file, line, text, pos} (pos: the offset of the `!`). */
function needlessAssertions(root = ROOT) {
  const configFile = ts.findConfigFile(root, ts.sys.fileExists, "tsconfig.json");
  const parsed = ts.getParsedCommandLineOfConfigFile(
    configFile,
    {},
    { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => {} },
  );
  const program = ts.createProgram(parsed.fileNames, parsed.options);
  const checker = program.getTypeChecker();
  const NULLISH =
    ts.TypeFlags.Null | ts.TypeFlags.Undefined | ts.TypeFlags.Void | ts.TypeFlags.Any | ts.TypeFlags.Unknown;
  const mayBeNullish = (t) => {
    if (t.flags & (NULLISH | ts.TypeFlags.TypeParameter | ts.TypeFlags.Index | ts.TypeFlags.IndexedAccess)) return true;
    return t.isUnion() ? t.types.some(mayBeNullish) : false;
  };
  const out = [];
  for (const sf of program.getSourceFiles()) {
    if (
      sf.isDeclarationFile ||
      path.relative(root, sf.fileName).startsWith("..") ||
      sf.fileName.includes("node_modules")
    )
      continue;
    const visit = (node) => {
      if (ts.isNonNullExpression(node) && !mayBeNullish(checker.getTypeAtLocation(node.expression))) {
        const pos = node.getEnd() - 1;
        const { line } = sf.getLineAndCharacterOfPosition(pos);
        out.push({ file: path.relative(root, sf.fileName), line: line + 1, text: node.getText(sf), pos });
      }
      ts.forEachChild(node, visit);
    };
    visit(sf);
  }
  return out;
}

/** Removes the `!` of each finding (from the end of each file backwards, so offsets stay valid). */
function fix(found, root = ROOT) {
  const byFile = new Map();
  for (const f of found) byFile.set(f.file, [...(byFile.get(f.file) ?? []), f.pos]);
  for (const [file, positions] of byFile) {
    const full = path.join(root, file);
    let text = fs.readFileSync(full, "utf8");
    for (const pos of positions.sort((a, b) => b - a)) {
      if (text[pos] !== "!") throw new Error(`${file}: expected "!" at offset ${pos}`);
      text = text.slice(0, pos) + text.slice(pos + 1);
    }
    fs.writeFileSync(full, text);
  }
}

module.exports = { needlessAssertions, fix };

if (require.main === module) {
  const found = needlessAssertions();
  if (process.argv.includes("--fix")) {
    fix(found);
    console.log(`removed ${found.length} needless non-null assertions`);
  } else {
    for (const f of found) console.log(`${f.file}:${f.line}: needless non-null assertion: ${f.text}`);
    console.log(`needless non-null assertions: ${found.length === 0 ? "none" : found.length}`);
    process.exitCode = found.length === 0 ? 0 : 1;
  }
}
