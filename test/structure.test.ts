/**
 * The structure of src/: no import cycle, no upward import against the layer table, every module in a
 * layer. The checks are those of `npm run deps` (scripts/deps.cjs), required here, not written again; the
 * planted trees below show that each check catches the defect it names. And the lifecycle maps: every module
 * a map names exists.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { POINTER_PATH } from "../src/hub/server/routes";
import { POINTER_FILE } from "../src/checkpoint/names";

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
  longFiles: { file: string; lines: number }[];
  fenced: { from: string; to: string; fence: string }[];
  sameNames: string[][];
  benchIntoTest: { from: string; to: string }[];
}
interface Deps {
  LAYERS: Layer[];
  LONG_FUNCTION_LINES: number;
  MAX_FILE_LINES: number;
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
  assert.ok(
    r.modules.length > 20 && r.edges.length > 50,
    `read ${r.modules.length} modules, ${r.edges.length} imports`,
  );
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

test("the local Hub server imports only from hub/ and errors.ts; no two files of src/ share a name; bench/ never imports test/", () => {
  const r = deps.analyze(path.join(ROOT, "src"));
  assert.ok(
    r.modules.some((m) => m.startsWith("hub/server/")),
    "hub/server/ was read",
  );
  assert.deepEqual(r.fenced, [], describe(r));
  assert.deepEqual(r.sameNames, [], describe(r));
  assert.deepEqual(r.benchIntoTest, [], describe(r));
});

test("no file of src/ is over 800 lines (each holds one room), and a planted longer one fails `npm run deps`", () => {
  assert.equal(deps.MAX_FILE_LINES, 800);
  const r = deps.analyze(path.join(ROOT, "src"));
  assert.deepEqual(r.longFiles, [], describe(r));
  const dir = plant({
    "errors.ts": "export class UserError extends Error {}\n",
    "model/a.ts": `${"export const a = 1;\n".repeat(800)}`,
  });
  const runDeps = () => spawnSync(process.execPath, [SCRIPT, dir], { encoding: "utf8" });
  try {
    const at = runDeps();
    assert.equal(at.status, 0, at.stdout + at.stderr);
    assert.match(at.stdout, /files of src\/ over 800 lines: none/);
    fs.appendFileSync(path.join(dir, "model", "a.ts"), "export const b = 2;\n");
    assert.deepEqual(deps.analyze(dir).longFiles, [{ file: "model/a.ts", lines: 801 }]);
    const over = runDeps();
    assert.equal(over.status, 1, over.stdout);
    assert.match(over.stdout, /files of src\/ over 800 lines: model\/a\.ts \(801\)/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("the local Hub's pointer file is the one the trainer writes (the server does not import the trainer's names)", () => {
  assert.equal(POINTER_PATH, POINTER_FILE);
});

test("a planted fenced import, a planted name used twice and a planted bench -> test import each fail `npm run deps`", () => {
  const dir = plant({
    "src/errors.ts": "export class UserError extends Error {}\n",
    "src/checkpoint/names.ts": 'export const POINTER_FILE = "latest.json";\n',
    "src/hub/server/routes.ts": 'import { UserError } from "../../errors";\nexport const r = UserError;\n',
    "src/hub/server.ts": 'import { r } from "./server/routes";\nexport const s = r;\n',
    "src/main.ts": 'import { s } from "./hub/server";\nconsole.log(s);\n',
    "test/helpers/mix.ts": "export const mix = 1;\n",
    "bench/bench.ts": 'import { s } from "../src/hub/server";\nconsole.log(s);\n',
  });
  const src = path.join(dir, "src");
  const runDeps = () => spawnSync(process.execPath, [SCRIPT, src], { encoding: "utf8" });
  try {
    const clean = runDeps();
    assert.equal(clean.status, 0, clean.stdout + clean.stderr);
    fs.writeFileSync(
      path.join(src, "hub", "server", "routes.ts"),
      'import { POINTER_FILE } from "../../checkpoint/names";\nexport const r = POINTER_FILE;\n',
    );
    let r = deps.analyze(src);
    assert.deepEqual(
      r.fenced.map((f) => `${f.from} -> ${f.to}`),
      ["hub/server/routes.ts -> checkpoint/names.ts"],
    );
    const fenced = runDeps();
    assert.equal(fenced.status, 1, fenced.stdout);
    assert.match(fenced.stdout, /fenced imports: 1\n {2}hub\/server\/routes\.ts -> checkpoint\/names\.ts/);
    fs.writeFileSync(
      path.join(src, "hub", "server", "routes.ts"),
      'import { UserError } from "../../errors";\nexport const r = UserError;\n',
    );
    fs.writeFileSync(path.join(src, "hub", "errors.ts"), "export {};\n");
    r = deps.analyze(src);
    assert.deepEqual(r.sameNames, [["errors.ts", "hub/errors.ts"]]);
    assert.equal(runDeps().status, 1);
    fs.rmSync(path.join(src, "hub", "errors.ts"));
    fs.writeFileSync(
      path.join(dir, "bench", "bench.ts"),
      'import { mix } from "../test/helpers/mix";\nconsole.log(mix);\n',
    );
    r = deps.analyze(src);
    assert.deepEqual(r.benchIntoTest, [{ from: "bench/bench.ts", to: "test/helpers/mix" }]);
    const bench = runDeps();
    assert.equal(bench.status, 1, bench.stdout);
    assert.match(bench.stdout, /bench\/ importing test\/: bench\/bench\.ts -> test\/helpers\/mix/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("a planted import cycle is found, through type-only imports and worker files too", () => {
  const dir = plant({
    "errors.ts": "export class UserError extends Error {}\n",
    "model/a.ts": 'import { b } from "./b";\nexport const a = b;\n',
    "model/b.ts": 'import type { C } from "./c";\nexport const b: C | null = null;\n',
    "model/c.ts":
      'import * as path from "node:path";\nimport { Worker } from "node:worker_threads";\nexport type C = number;\nexport const start = () => new Worker(path.join(__dirname, "a.js"));\n',
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

// ---------------------------------------------------------------------------------------------
// The lifecycle maps: the header comment of the module a reader opens first names, in order, the modules
// each lifecycle passes through. A map that names a module that is gone sends the reader nowhere.

/** The modules that open with a lifecycle map (paths under src/), and what each maps. */
const MAPS: Record<string, string> = {
  "checkpoint/index.ts": "the checkpoint: save, publish, resume",
  "single-thread.ts": "the training step",
  "session/dist.ts": "multi-host (--dist mpi)",
  "generate.ts": "generation",
  "model/engine/webgpu/engine.ts": "the webgpu engine's rooms",
};

/**
 * The paths a module's header comment names (a word ending in .ts, .c, .h or .cjs), each with the file it
 * resolves to: beside the module, under src/, or under the repository root, the first that exists; null when
 * none does.
 */
function mapPaths(root: string, moduleRel: string): { named: string; found: string | null }[] {
  const src = path.join(root, "src");
  const text = fs.readFileSync(path.join(src, moduleRel), "utf8");
  const header = /^\/\*\*([\s\S]*?)\*\//.exec(text);
  assert.ok(header, `${moduleRel} opens with a /** */ header comment`);
  const names = [
    ...header[1].matchAll(/(?<=^|[\s(`'"])((?:[\w-]+\/)*[\w-][\w.-]*\.(?:ts|c|h|cjs))(?=[\s),.;:`'"]|$)/gm),
  ].map((m) => m[1]);
  const dirs = [path.join(src, path.dirname(moduleRel)), src, root];
  return names.map((named) => ({
    named,
    found:
      dirs.map((d) => path.join(d, named)).find((f) => fs.statSync(f, { throwIfNoEntry: false })?.isFile()) ?? null,
  }));
}

test("every module a lifecycle map names exists (checkpoint, step, multi-host, generation, the webgpu engine)", () => {
  for (const [mod, what] of Object.entries(MAPS)) {
    const paths = mapPaths(ROOT, mod);
    assert.ok(paths.length >= 8, `${mod} maps ${what} through at least 8 modules (it names ${paths.length})`);
    assert.deepEqual(
      paths.filter((p) => p.found === null).map((p) => p.named),
      [],
      `${mod}'s map of ${what} names modules that do not exist`,
    );
  }
});

test("a map naming a module that is gone fails the check", () => {
  const dir = plant({
    "src/session/loop.ts": "export {};\n",
    "src/run.ts": "export {};\n",
    "native/tstrain.c": "int x;\n",
    "src/session/map.ts":
      "/**\n * The map:\n *   1. run.ts runSession → session/loop.ts (loop.ts), native/tstrain.c; not optim*.ts\n *   2. session/gone.ts\n */\nexport {};\n",
  });
  try {
    assert.deepEqual(
      mapPaths(dir, "session/map.ts").map((p) => [p.named, p.found && path.relative(dir, p.found)]),
      [
        ["run.ts", "src/run.ts"],
        ["session/loop.ts", "src/session/loop.ts"],
        ["loop.ts", "src/session/loop.ts"],
        ["native/tstrain.c", "native/tstrain.c"],
        ["session/gone.ts", null],
      ],
    );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
