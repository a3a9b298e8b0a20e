#!/usr/bin/env node
// `npm run deps`: the import graph of src/, its cycles, its upward imports against the layer table
// below, and the functions of src/ longer than LONG_FUNCTION_LINES lines.
//
// Imports are read with the TypeScript parser (the `typescript` devDependency), not a regex: every
// `import ... from`, `export ... from`, `import x = require()`, `require("...")`, `import("...")`
// (also in type position: `import("../hub/client").Pointer` is a dependency of the module that writes
// it) and `new Worker(path.join(__dirname, "x.js"))` (a worker file is started by its parent, so the
// parent depends on it). Only relative specifiers that resolve to a file under src/ are edges; npm
// packages and node: builtins are not part of the graph.
//
// Exit status: 1 on a cycle, an upward import, or a module that no layer claims (a new file must be
// placed in the table, or it would escape the check), a fenced import (the local Hub server imports only
// from hub/ and errors.ts), two files of src/ with the same name, a file of src/ over MAX_FILE_LINES lines,
// or bench/ importing from test/; 0 otherwise. Long functions are reported, not fatal (a function may stay whole when splitting it would
// not make it clearer).
//
// test/structure.test.ts requires this file and runs `analyze` on src/ (so `npm test` fails on a cycle
// or an upward import) and on planted trees (so the checks themselves are shown to catch them).
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const ts = require("typescript");

const LONG_FUNCTION_LINES = 60;
/** No file of src/ is longer: a longer one holds more than one room (split it along its seams). */
const MAX_FILE_LINES = 800;
const KIND_RANK = { import: 0, require: 0, worker: 1, type: 2 };

// The layer table, lowest first. A module may import modules of its own layer or of a lower one;
// importing a higher layer is an "upward import". Patterns are paths relative to src/ (`**` any
// folders, `*` any name part, `{a,b}` alternatives). The first layer whose pattern matches wins.
const LAYERS = [
  {
    layer: 1,
    name: "foundation",
    // Error types, the one validated config and the small commands' flag parser: everything else may use them,
    // and they use nothing of ours (config.ts reads only errors.ts, config-argv.ts: the command line's words to flag
    // values and a refusal's changes back to words, config-file.ts, a --config file's keys and
    // values against the flag table config.ts hands it, and hub/address.ts: where the Hub is (--hub-url,
    // HF_ENDPOINT, the default), the hf:// grammar and the rules for a repo id and a path in a repo, which prepare,
    // generate, the Hub client and the local Hub hold to as well);
    // duration.ts formats a duration for every progress line, the training's, prepare's and the Hub transfers', and
    // progress.ts holds the one rhythm of those lines (TSTRAIN_PROGRESS_SECONDS); pipes.ts keeps a reader that
    // closes stdout or stderr (`| head`) from ending any command (O7).
    patterns: [
      "errors.ts",
      "config.ts",
      "config-argv.ts",
      "config-file.ts",
      "cli-args.ts",
      "duration.ts",
      "progress.ts",
      "pipes.ts",
      "hub/address.ts",
    ],
  },
  {
    layer: 2,
    name: "model, data, Hub client and local Hub",
    // Independent libraries: the model (kernels, engines, safetensors; the webgpu engine's rooms under
    // model/engine/webgpu/: gpus, device, arena, recorder, matmul-plan, engine, and shaders/ by family), the data pipeline (mix,
    // tokenizer, sampler), the local Hub server (src/hub/server.ts and its parts) and the Hub
    // client's building blocks (client, hub-errors: the errors and the token's scrubbing, transfer: a transfer's
    // progress lines, retry, start: the Hub calls before step 1, retried, and the refusals of a Hub that cannot
    // serve, safetensors-check, token: HF_TOKEN's form). None of them knows about
    // checkpoints, actors or sessions. hub/safetensors-check.ts reads model/safetensors.ts, a
    // same-layer import. The checkpoint's formats (checkpoint/names.ts: the layout's names;
    // checkpoint/state.ts: the documents' types and their one parser each, latest.json included) are
    // pure: names.ts reads only data/cursor.ts (the cursor's file name), state.ts errors.ts, names.ts,
    // stateful.ts and the field validators of the parts it composes (data/cursor.ts, optim/optim-state.ts;
    // optim/optim.ts for types); the Hub client reads and writes latest.json with them, and the run folder's
    // rules (outdir.ts) know the checkpoint folder's names. The MPI binding's
    // wrapper (mpi/**) loads libmpi and runs collectives on buffers; it knows nothing of the model or the run.
    // The optimizer (optim/**) is pure maths on flat arrays, used by the actors and the single-thread loop; its
    // checkpointed parts (optim/optim-state.ts) and the data's (data/cursor.ts) implement checkpoint/stateful.ts,
    // the contract of a part with state (types only), and checkpoint/state.ts composes their
    // fields' validators into the one parser of trainer_state.json.
    patterns: [
      "outdir.ts",
      "checkpoint/{names,state,stateful}.ts",
      "optim/**",
      "model/**",
      "data/**",
      "hub/server/**",
      "hub/server.ts",
      "hub/{client,hub-errors,transfer,retry,start,safetensors-check,token}.ts",
      "mpi/**",
    ],
  },
  {
    layer: 3,
    name: "checkpoint",
    // A checkpoint is model weights + optimizer state + the data cursor: writing and reading a folder
    // (checkpoint/{save,load}.ts), the manager that saves and restores the stateful parts (manager.ts), and
    // index.ts, the module's public face, build on layer 2 only.
    patterns: ["checkpoint/**"],
  },
  {
    layer: 4,
    name: "Hub checkpoint cycle",
    // Publishing a checkpoint to the Hub, and resuming from one: they use checkpoint/ and the Hub
    // client (layers 2-3); the actors call them.
    patterns: ["hub/{cycle,resume}.ts"],
  },
  {
    layer: 5,
    name: "actors",
    // The runtime: coordinator, ranks, optimizer, uploader, the one message protocol, shared memory.
    patterns: ["actors/**"],
  },
  {
    layer: 6,
    name: "session and commands' bodies",
    // A training session (run.ts and src/session/**), the framework-free loop
    // (single-thread.ts), the report, generation.ts (loading a model folder and generating text: the
    // `generate` command and the sample a run logs at each checkpoint), and the bodies of `generate` and `prepare`.
    patterns: ["run.ts", "session/**", "single-thread.ts", "report.ts", "generation.ts", "generate.ts", "prepare.ts"],
  },
  {
    layer: 7,
    name: "entry points",
    // What `node dist/X.js` starts: nothing imports them.
    patterns: ["main.ts", "hub-server.ts", "compare.ts"],
  },
];

// Fences, whatever the layers say: the local Hub server is a stand-in for huggingface.co and shares nothing
// with the trainer but the error types; it may import only from hub/ and errors.ts.
const FENCES = [
  { name: "the local Hub server", patterns: ["hub/server.ts", "hub/server/**"], allowed: ["hub/**", "errors.ts"] },
];

/** Mini-glob to RegExp: `**` (any folders), `*` (within one name), `{a,b}` (alternatives). */
function globToRegExp(glob) {
  let re = "";
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i];
    if (c === "*" && glob[i + 1] === "*") {
      re += ".*";
      i++;
    } else if (c === "*") re += "[^/]*";
    else if (c === "{") re += "(?:";
    else if (c === "}") re += ")";
    else if (c === ",") re += "|";
    else re += c.replace(/[.+?^$()|[\]\\]/g, "\\$&");
  }
  return new RegExp(`^${re}$`);
}

/** The layer entry that claims `rel` (a path relative to src/, with `/`), or null. */
function layerOf(rel, layers = LAYERS) {
  for (const entry of layers) {
    if (entry.patterns.some((p) => globToRegExp(p).test(rel))) return entry;
  }
  return null;
}

function listTsFiles(dir) {
  const out = [];
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const full = path.join(d, e.name);
      if (e.isDirectory()) walk(full);
      else if (e.isFile() && e.name.endsWith(".ts") && !e.name.endsWith(".d.ts")) out.push(full);
    }
  };
  walk(dir);
  return out.sort();
}

const toRel = (srcDir, file) => path.relative(srcDir, file).split(path.sep).join("/");

/** Resolve a relative specifier from `fromFile` to a .ts file under srcDir, or null. */
function resolveSpecifier(srcDir, fromFile, spec) {
  if (!spec.startsWith(".")) return null;
  const base = path.resolve(path.dirname(fromFile), spec);
  const stem = base.replace(/\.(js|ts)$/, "");
  for (const candidate of [`${stem}.ts`, path.join(base, "index.ts")]) {
    if (fs.existsSync(candidate) && !path.relative(srcDir, candidate).startsWith("..")) return candidate;
  }
  return null;
}

/** `path.join(__dirname, "x.js")` (or path.resolve) inside `new Worker(...)`/`new Piscina({filename})`: "./x.js". */
function workerSpecifier(node) {
  if (!ts.isCallExpression(node)) return null;
  const callee = node.expression;
  if (!ts.isPropertyAccessExpression(callee) || !["join", "resolve"].includes(callee.name.text)) return null;
  const [first, ...rest] = node.arguments;
  if (!first || !ts.isIdentifier(first) || first.text !== "__dirname" || rest.length === 0) return null;
  if (!rest.every((a) => ts.isStringLiteral(a))) return null;
  return `./${rest.map((a) => a.text).join("/")}`;
}

/** The relative specifiers one source file imports, with how (import, type, require, worker). */
function importsOf(sourceFile) {
  const found = [];
  const add = (spec, kind) => found.push({ spec, kind });
  const visit = (node) => {
    if (
      (ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) &&
      node.moduleSpecifier &&
      ts.isStringLiteral(node.moduleSpecifier)
    ) {
      const typeOnly = ts.isImportDeclaration(node) ? Boolean(node.importClause?.isTypeOnly) : node.isTypeOnly;
      add(node.moduleSpecifier.text, typeOnly ? "type" : "import");
    } else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference)) {
      const e = node.moduleReference.expression;
      if (ts.isStringLiteral(e)) add(e.text, "import");
    } else if (
      ts.isImportTypeNode(node) &&
      ts.isLiteralTypeNode(node.argument) &&
      ts.isStringLiteral(node.argument.literal)
    ) {
      add(node.argument.literal.text, "type");
    } else if (ts.isCallExpression(node)) {
      const isRequire = ts.isIdentifier(node.expression) && node.expression.text === "require";
      const isDynamic = node.expression.kind === ts.SyntaxKind.ImportKeyword;
      const [arg] = node.arguments;
      if ((isRequire || isDynamic) && arg && ts.isStringLiteral(arg)) add(arg.text, isRequire ? "require" : "import");
      const worker = workerSpecifier(node);
      if (worker) add(worker, "worker");
    }
    ts.forEachChild(node, visit);
  };
  visit(sourceFile);
  return found;
}

/** Functions (declarations, methods, constructors, accessors, arrows, expressions) longer than `limit` lines. */
function longFunctionsOf(sourceFile, rel, limit = LONG_FUNCTION_LINES) {
  const out = [];
  const nameOf = (node) => {
    if (
      node.name &&
      (ts.isIdentifier(node.name) || ts.isStringLiteral(node.name) || ts.isPrivateIdentifier(node.name))
    ) {
      const own = node.name.text;
      const cls = node.parent && ts.isClassLike(node.parent) && node.parent.name ? `${node.parent.name.text}.` : "";
      return cls + own;
    }
    if (ts.isConstructorDeclaration(node)) return `${node.parent.name ? node.parent.name.text : "(class)"}.constructor`;
    const p = node.parent;
    if (p && ts.isVariableDeclaration(p) && ts.isIdentifier(p.name)) return p.name.text;
    if (p && ts.isPropertyAssignment(p) && (ts.isIdentifier(p.name) || ts.isStringLiteral(p.name))) return p.name.text;
    if (p && ts.isPropertyDeclaration(p) && ts.isIdentifier(p.name)) return p.name.text;
    return "(anonymous)";
  };
  const visit = (node) => {
    if (ts.isFunctionLike(node) && node.body) {
      const start = sourceFile.getLineAndCharacterOfPosition(node.getStart(sourceFile)).line + 1;
      const end = sourceFile.getLineAndCharacterOfPosition(node.getEnd()).line + 1;
      const lines = end - start + 1;
      if (lines > limit) out.push({ file: rel, name: nameOf(node), start, end, lines });
    }
    ts.forEachChild(node, visit);
  };
  visit(sourceFile);
  return out;
}

/** Elementary cycles' representatives: one cycle per strongly connected component (Tarjan), as a path. */
function findCycles(nodes, edges) {
  const adj = new Map(nodes.map((n) => [n, []]));
  for (const e of edges) if (adj.has(e.from)) adj.get(e.from).push(e.to);
  let index = 0;
  const idx = new Map();
  const low = new Map();
  const onStack = new Set();
  const stack = [];
  const sccs = [];
  const strong = (v) => {
    idx.set(v, index);
    low.set(v, index);
    index++;
    stack.push(v);
    onStack.add(v);
    for (const w of adj.get(v) ?? []) {
      if (!idx.has(w)) {
        strong(w);
        low.set(v, Math.min(low.get(v), low.get(w)));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v), idx.get(w)));
    }
    if (low.get(v) === idx.get(v)) {
      const scc = [];
      let w;
      do {
        w = stack.pop();
        onStack.delete(w);
        scc.push(w);
      } while (w !== v);
      const selfLoop = (adj.get(v) ?? []).includes(v);
      if (scc.length > 1 || selfLoop) sccs.push(new Set(scc));
    }
  };
  for (const n of nodes) if (!idx.has(n)) strong(n);
  // One concrete cycle per component: breadth-first from its first member back to itself.
  return sccs.map((scc) => {
    const startNode = [...scc].sort()[0];
    const prev = new Map();
    const queue = [startNode];
    while (queue.length > 0) {
      const v = queue.shift();
      for (const w of adj.get(v) ?? []) {
        if (!scc.has(w)) continue;
        if (w === startNode) {
          const cyclePath = [startNode];
          for (let u = v; u !== startNode; u = prev.get(u)) cyclePath.splice(1, 0, u);
          cyclePath.push(startNode);
          return cyclePath;
        }
        if (!prev.has(w)) {
          prev.set(w, v);
          queue.push(w);
        }
      }
    }
    return [startNode, startNode];
  });
}

/**
 * Read every .ts file under srcDir: modules (relative paths), edges {from, to, kind}, cycles (paths),
 * upward imports (edges whose target's layer is above the importer's), unlayered modules, and functions
 * longer than LONG_FUNCTION_LINES.
 */
function analyze(srcDir, layers = LAYERS) {
  const files = listTsFiles(srcDir);
  const modules = files.map((f) => toRel(srcDir, f));
  const edges = [];
  const longFunctions = [];
  const longFiles = [];
  for (const file of files) {
    const rel = toRel(srcDir, file);
    const text = fs.readFileSync(file, "utf8");
    const lines = text.split("\n").length - (text.endsWith("\n") ? 1 : 0);
    if (lines > MAX_FILE_LINES) longFiles.push({ file: rel, lines });
    const sourceFile = ts.createSourceFile(file, text, ts.ScriptTarget.ES2022, true, ts.ScriptKind.TS);
    // One edge per target; a value import outranks a worker start, which outranks a type-only import.
    const byTarget = new Map();
    for (const { spec, kind } of importsOf(sourceFile)) {
      const target = resolveSpecifier(srcDir, file, spec);
      if (target === null) continue;
      const to = toRel(srcDir, target);
      const known = byTarget.get(to);
      if (known === undefined || KIND_RANK[kind] < KIND_RANK[known]) byTarget.set(to, kind);
    }
    for (const [to, kind] of byTarget) edges.push({ from: rel, to, kind });
    longFunctions.push(...longFunctionsOf(sourceFile, rel));
  }
  const layerOfModule = new Map(modules.map((m) => [m, layerOf(m, layers)]));
  const unlayered = modules.filter((m) => layerOfModule.get(m) === null);
  const upward = edges
    .filter((e) => {
      const a = layerOfModule.get(e.from);
      const b = layerOfModule.get(e.to);
      return a && b && b.layer > a.layer;
    })
    .map((e) => ({ ...e, fromLayer: layerOfModule.get(e.from).layer, toLayer: layerOfModule.get(e.to).layer }));
  const cycles = findCycles(modules, edges);
  longFunctions.sort((x, y) => y.lines - x.lines);
  const matches = (patterns, rel) => patterns.some((p) => globToRegExp(p).test(rel));
  const fenced = edges
    .map((e) => ({ ...e, fence: FENCES.find((f) => matches(f.patterns, e.from)) }))
    .filter((e) => e.fence && !matches(e.fence.allowed, e.to))
    .map((e) => ({ from: e.from, to: e.to, kind: e.kind, fence: e.fence.name }));
  const byName = new Map();
  for (const m of modules) byName.set(path.posix.basename(m), [...(byName.get(path.posix.basename(m)) ?? []), m]);
  const sameNames = [...byName.values()].filter((ms) => ms.length > 1);
  // bench/ (a sibling of src/) may use src/ but never test/: what a benchmark needs lives where both may import it.
  const root = path.dirname(srcDir);
  const benchIntoTest =
    path.basename(srcDir) === "src" ? importsInto(path.join(root, "bench"), path.join(root, "test"), root) : [];
  return {
    modules,
    edges,
    layerOfModule,
    unlayered,
    upward,
    cycles,
    longFunctions,
    longFiles,
    fenced,
    sameNames,
    benchIntoTest,
  };
}

/** Relative imports of the .ts files under `fromDir` that resolve into `intoDir`: {from, to} paths relative to `root`. */
function importsInto(fromDir, intoDir, root) {
  if (!fs.existsSync(fromDir)) return [];
  const out = [];
  for (const file of listTsFiles(fromDir)) {
    const sourceFile = ts.createSourceFile(
      file,
      fs.readFileSync(file, "utf8"),
      ts.ScriptTarget.ES2022,
      true,
      ts.ScriptKind.TS,
    );
    for (const { spec } of importsOf(sourceFile)) {
      if (!spec.startsWith(".")) continue;
      const target = path.resolve(path.dirname(file), spec);
      if (!path.relative(intoDir, target).startsWith(".."))
        out.push({ from: toRel(root, file), to: toRel(root, target) });
    }
  }
  return out;
}

/** The report `npm run deps` prints: layers with each module's imports, then the verdicts. */
function format(result, layers = LAYERS) {
  const lines = [];
  const byFrom = new Map();
  for (const e of result.edges) {
    if (!byFrom.has(e.from)) byFrom.set(e.from, []);
    byFrom.get(e.from).push(e.kind === "import" ? e.to : `${e.to} (${e.kind})`);
  }
  for (const entry of [...layers].reverse()) {
    const members = result.modules.filter((m) => result.layerOfModule.get(m) === entry);
    if (members.length === 0) continue;
    lines.push(`layer ${entry.layer} ${entry.name}`);
    for (const m of members) {
      const targets = byFrom.get(m) ?? [];
      lines.push(`  ${m}${targets.length > 0 ? ` -> ${targets.join(", ")}` : ""}`);
    }
  }
  lines.push("");
  lines.push(`${result.modules.length} modules, ${result.edges.length} imports`);
  lines.push(`cycles: ${result.cycles.length === 0 ? "none" : result.cycles.length}`);
  for (const c of result.cycles) lines.push(`  ${c.join(" -> ")}`);
  lines.push(`upward imports: ${result.upward.length === 0 ? "none" : result.upward.length}`);
  for (const u of result.upward)
    lines.push(
      `  ${u.from} (layer ${u.fromLayer}) -> ${u.to} (layer ${u.toLayer})${u.kind === "import" ? "" : ` [${u.kind}]`}`,
    );
  lines.push(`modules in no layer: ${result.unlayered.length === 0 ? "none" : result.unlayered.join(", ")}`);
  lines.push(`fenced imports: ${result.fenced.length === 0 ? "none" : result.fenced.length}`);
  for (const f of result.fenced) lines.push(`  ${f.from} -> ${f.to} (${f.fence} imports only from hub/ and errors.ts)`);
  lines.push(
    `file names used twice in src/: ${result.sameNames.length === 0 ? "none" : result.sameNames.map((ms) => ms.join(" and ")).join("; ")}`,
  );
  lines.push(
    `files of src/ over ${MAX_FILE_LINES} lines: ${result.longFiles.length === 0 ? "none" : result.longFiles.map((f) => `${f.file} (${f.lines})`).join(", ")}`,
  );
  lines.push(
    `bench/ importing test/: ${result.benchIntoTest.length === 0 ? "none" : result.benchIntoTest.map((e) => `${e.from} -> ${e.to}`).join(", ")}`,
  );
  lines.push(
    `functions over ${LONG_FUNCTION_LINES} lines: ${result.longFunctions.length === 0 ? "none" : result.longFunctions.length}`,
  );
  for (const f of result.longFunctions) lines.push(`  ${f.lines} ${f.file}:${f.start} ${f.name}`);
  return lines.join("\n");
}

/**
 * True when the tree breaks a rule (cycle, upward or fenced import, unlayered module, a name used twice, a file over
 * MAX_FILE_LINES, bench/ using test/).
 */
function failed(result) {
  return [
    result.cycles,
    result.upward,
    result.unlayered,
    result.fenced,
    result.sameNames,
    result.longFiles,
    result.benchIntoTest,
  ].some((l) => l.length > 0);
}

module.exports = {
  LAYERS,
  FENCES,
  LONG_FUNCTION_LINES,
  MAX_FILE_LINES,
  analyze,
  format,
  failed,
  layerOf,
  globToRegExp,
};

if (require.main === module) {
  const srcDir = path.resolve(process.argv[2] ?? path.join(__dirname, "..", "src"));
  const result = analyze(srcDir);
  console.log(format(result));
  process.exitCode = failed(result) ? 1 : 0;
}
