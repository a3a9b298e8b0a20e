/**
 * The structure of src/ (#16): no import cycle, no upward import against the layer table, every module in a
 * layer. The checks are those of `npm run deps` (scripts/deps.cjs), required here, not written again; the
 * planted trees below show that each check catches the defect it names.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { spawnSync } from "node:child_process";

const ROOT = path.join(__dirname, "..", "..");
const SCRIPT = path.join(ROOT, "scripts", "deps.cjs");

interface Edge {
  from: string;
  to: string;
  kind: "import" | "require" | "type" | "worker";
}
interface Layer {
  layer: number;
  name: string;
  patterns: string[];
}
interface Result {
  modules: string[];
  edges: Edge[];
  cycles: string[][];
  upward: (Edge & { fromLayer: number; toLayer: number })[];
  unlayered: string[];
  longFunctions: { file: string; name: string; start: number; end: number; lines: number }[];
}
interface Deps {
  LAYERS: Layer[];
  LONG_FUNCTION_LINES: number;
  analyze(srcDir: string, layers?: Layer[]): Result;
  format(result: Result, layers?: Layer[]): string;
  failed(result: Result): boolean;
}
const deps = require(SCRIPT) as Deps;

/** A throwaway src/ tree: relative path -> contents. */
function plant(files: Record<string, string>): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-structure-"));
  for (const [rel, text] of Object.entries(files)) {
    fs.mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
    fs.writeFileSync(path.join(dir, rel), text);
  }
  return dir;
}

const describe = (r: Result) => deps.format(r);

test("src/ has no import cycle", () => {
  const r = deps.analyze(path.join(ROOT, "src"));
  assert.ok(r.modules.length > 20 && r.edges.length > 50, `read ${r.modules.length} modules, ${r.edges.length} imports`);
  assert.deepEqual(r.cycles, [], describe(r));
});

test("src/ imports only its own layer or a lower one (the table in scripts/deps.cjs)", () => {
  const r = deps.analyze(path.join(ROOT, "src"));
  assert.deepEqual(
    r.upward.map((u) => `${u.from} (layer ${u.fromLayer}) -> ${u.to} (layer ${u.toLayer})`),
    [],
    describe(r),
  );
});

test("every module of src/ has a layer in the table", () => {
  const r = deps.analyze(path.join(ROOT, "src"));
  assert.deepEqual(r.unlayered, [], describe(r));
});

test("a planted import cycle is found, through type-only imports and worker files too", () => {
  const dir = plant({
    "errors.ts": "export class UserError extends Error {}\n",
    "model/a.ts": 'import { b } from "./b";\nexport const a = b;\n',
    "model/b.ts": 'import type { C } from "./c";\nexport const b: C | null = null;\n',
    "model/c.ts": 'import * as path from "node:path";\nimport { Worker } from "node:worker_threads";\nexport type C = number;\nexport const start = () => new Worker(path.join(__dirname, "a.js"));\n',
    "model/leaf.ts": 'import { UserError } from "../errors";\nexport const leaf = UserError;\n',
  });
  try {
    const r = deps.analyze(dir);
    assert.equal(r.cycles.length, 1, describe(r));
    assert.deepEqual(r.cycles[0], ["model/a.ts", "model/b.ts", "model/c.ts", "model/a.ts"]);
    assert.deepEqual(r.upward, []);
    assert.equal(deps.failed(r), true);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("a planted upward import is found, also when it is a type or an import() type", () => {
  const dir = plant({
    "errors.ts": 'import { X } from "./actors/x";\nexport const e = X;\n',
    "config.ts": 'export type T = import("./run").R;\n',
    "model/m.ts": 'import type { Ck } from "../checkpoint/index";\nexport const m: Ck | null = null;\n',
    "checkpoint/index.ts": "export type Ck = number;\n",
    "actors/x.ts": "export const X = 1;\n",
    "run.ts": 'import { X } from "./actors/x";\nexport type R = typeof X;\n',
  });
  try {
    const r = deps.analyze(dir);
    assert.deepEqual(r.cycles, [], describe(r));
    assert.deepEqual(
      r.upward.map((u) => [u.from, u.to, u.kind, u.fromLayer, u.toLayer]),
      [
        ["config.ts", "run.ts", "type", 1, 6],
        ["errors.ts", "actors/x.ts", "import", 1, 5],
        ["model/m.ts", "checkpoint/index.ts", "type", 2, 3],
      ],
    );
    assert.equal(deps.failed(r), true);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("a module no layer claims is reported, and a tree that is clean passes", () => {
  const dir = plant({
    "errors.ts": "export class UserError extends Error {}\n",
    "model/m.ts": 'import { UserError } from "../errors";\nexport const m = UserError;\n',
    "run.ts": 'import { m } from "./model/m";\nexport const r = m;\n',
    "main.ts": 'import { r } from "./run";\nconsole.log(r);\n',
  });
  try {
    const clean = deps.analyze(dir);
    assert.equal(deps.failed(clean), false, describe(clean));
    assert.equal(clean.edges.length, 3);
    fs.writeFileSync(path.join(dir, "stray.ts"), "export {};\n");
    const stray = deps.analyze(dir);
    assert.deepEqual(stray.unlayered, ["stray.ts"]);
    assert.equal(deps.failed(stray), true);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("functions longer than the limit are listed with their names, one at the limit is not", () => {
  const limit = deps.LONG_FUNCTION_LINES;
  const body = (n: number) => Array.from({ length: n - 2 }, (_, i) => `  const v${i} = ${i};`).join("\n");
  const dir = plant({
    "model/f.ts": [
      `export function atLimit() {\n${body(limit)}\n}`,
      `export function overLimit() {\n${body(limit + 1)}\n}`,
      `export class K {\n  method() {\n${body(limit + 5)}\n  }\n}`,
      `export const arrow = () => {\n${body(limit + 2)}\n};`,
    ].join("\n"),
  });
  try {
    const r = deps.analyze(dir);
    assert.deepEqual(
      r.longFunctions.map((f) => [f.name, f.lines]),
      [
        ["K.method", limit + 5],
        ["arrow", limit + 2],
        ["overLimit", limit + 1],
      ],
    );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("`npm run deps` exits 1 on a planted cycle and 0 on a clean tree", () => {
  const dir = plant({
    "errors.ts": "export class UserError extends Error {}\n",
    "model/a.ts": 'import { UserError } from "../errors";\nexport const a = UserError;\n',
  });
  try {
    const clean = spawnSync(process.execPath, [SCRIPT, dir], { encoding: "utf8" });
    assert.equal(clean.status, 0, clean.stdout + clean.stderr);
    assert.match(clean.stdout, /cycles: none/);
    fs.writeFileSync(path.join(dir, "model", "b.ts"), 'import { c } from "./c";\nexport const b = c;\n');
    fs.writeFileSync(path.join(dir, "model", "c.ts"), 'import { b } from "./b";\nexport const c = b;\n');
    const cyclic = spawnSync(process.execPath, [SCRIPT, dir], { encoding: "utf8" });
    assert.equal(cyclic.status, 1, cyclic.stdout + cyclic.stderr);
    assert.match(cyclic.stdout, /model\/b\.ts -> model\/c\.ts -> model\/b\.ts/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
