/**
 * Every rule id the code cites is defined in docs/RULES.md, exactly once, with its rule, its reason and the tests
 * that cover it; and the tests it names exist.
 *
 * What counts as a citation (the pattern, also stated in docs/RULES.md):
 * - an uppercase letter of a rule group, then a number 1..99 with no leading zero, standing alone: no letter,
 *   digit or underscore right before or right after it. So `0xB1`, a hex digest, `B1C`, `M10x` or a lowercase
 *   `d4` are not citations. The groups are A M P D C K R G B, and L (the local Hub
 *   server) and O (the run folder and the process). A new group's letter goes into GROUPS.
 * - only inside comments and string or template literals (and regex literals) of the .ts files under src/,
 *   test/ and bench/. Identifiers are names, not citations: a constant called after Adam's beta1 is code.
 *   The TypeScript parser decides what is a comment or a literal, so a `//` inside a string or a quote inside
 *   a comment cannot confuse it.
 * - whatever the letter: the rule of a refusal, i.e. the first argument of `new UserError("…", …)` and a string
 *   given to a property named `rule` (`rule = "K4"`, `{ rule: "K5" }`). So a refusal citing a group this file does
 *   not know yet is still checked.
 *
 * What counts as a definition: a line `### <ID> — <title>` in docs/RULES.md, followed (before the next heading)
 * by a paragraph starting `**Rule.**`, one starting `**Why.**` and one starting `**Tests.**`. The Tests paragraph
 * names test files in backticks (`hub.cycle.test.ts`, a path under test/) each followed by the test names in
 * double quotes, exactly as written in that file (a template name keeps its `${...}`), each closing quote followed
 * by ";", "." or "," and a space or the end of the paragraph; or the paragraph says `none` first.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import * as ts from "typescript";

const ROOT = path.join(__dirname, "..", "..");
const RULES_MD = path.join(ROOT, "docs", "RULES.md");
const SCANNED = ["src", "test", "bench"];

/** The rule groups' letters: nine for the trainer, L (local Hub server) and O (run folder and process). */
const GROUPS = "AMPDCKRGBLO";
/** A rule id as cited: group letter, 1..99, standing alone. */
const ID_PATTERN = new RegExp(`(?<![A-Za-z0-9_])[${GROUPS}][1-9][0-9]?(?![A-Za-z0-9_])`, "g");
/** A definition heading in docs/RULES.md (any capital letter: a refusal may cite a group GROUPS lacks). */
const DEF_HEADING = /^### ([A-Z][1-9][0-9]?) — \S.*$/;

interface Citation {
  file: string;
  line: number;
  id: string;
}

/** The text ranges of a TypeScript source that are comments or literals, with their start offsets. */
function citableRanges(sf: ts.SourceFile): Array<{ start: number; text: string }> {
  const text = sf.text;
  const out: Array<{ start: number; text: string }> = [];
  const seen = new Set<number>();
  const comments = (ranges: ts.CommentRange[] | undefined) => {
    for (const r of ranges ?? []) {
      if (seen.has(r.pos)) continue;
      seen.add(r.pos);
      out.push({ start: r.pos, text: text.slice(r.pos, r.end) });
    }
  };
  const visit = (node: ts.Node): void => {
    if (node.kind >= ts.SyntaxKind.FirstJSDocNode && node.kind <= ts.SyntaxKind.LastJSDocNode) return; // its text is a comment, read below
    const kids = node.getChildren(sf);
    if (kids.length === 0) {
      // A token: the trivia before it holds every comment between it and the previous token.
      comments(ts.getLeadingCommentRanges(text, node.pos));
      comments(ts.getTrailingCommentRanges(text, node.end));
      if (
        ts.isStringLiteralLike(node) ||
        ts.isTemplateLiteralToken(node) ||
        node.kind === ts.SyntaxKind.RegularExpressionLiteral
      ) {
        const start = node.getStart(sf);
        out.push({ start, text: text.slice(start, node.end) });
      }
      return;
    }
    for (const k of kids) visit(k);
  };
  visit(sf);
  comments(ts.getLeadingCommentRanges(text, 0)); // a header comment before the first token
  return out;
}

/** String literals that name the rule of a refusal: `new UserError("X", …)`, `rule = "X"`, `{ rule: "X" }`. */
function ruleArguments(sf: ts.SourceFile): ts.StringLiteralLike[] {
  const out: ts.StringLiteralLike[] = [];
  const visit = (n: ts.Node): void => {
    if (
      ts.isNewExpression(n) &&
      n.expression.getText(sf) === "UserError" &&
      n.arguments?.[0] &&
      ts.isStringLiteralLike(n.arguments[0])
    ) {
      out.push(n.arguments[0]);
    }
    if (
      (ts.isPropertyDeclaration(n) || ts.isPropertyAssignment(n)) &&
      n.name.getText(sf) === "rule" &&
      n.initializer &&
      ts.isStringLiteralLike(n.initializer)
    ) {
      out.push(n.initializer);
    }
    ts.forEachChild(n, visit);
  };
  visit(sf);
  return out;
}

/** Every rule id cited in one TypeScript source text. */
function citationsIn(file: string, source: string): Citation[] {
  const sf = ts.createSourceFile(file, source, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
  const found = new Map<number, string>(); // source offset -> id
  for (const r of citableRanges(sf)) {
    for (const m of r.text.matchAll(ID_PATTERN)) found.set(r.start + m.index, m[0]);
  }
  for (const lit of ruleArguments(sf)) found.set(lit.getStart(sf) + 1, lit.text); // the same offset as the pattern's match
  return [...found]
    .sort((a, b) => a[0] - b[0])
    .map(([pos, id]) => ({ file, line: sf.getLineAndCharacterOfPosition(pos).line + 1, id }));
}

/**
 * The names of a test file's tests and suites: the first argument of every `test(…)`, `it(…)` and `describe(…)`
 * call, a string's text, or a template's source between its backticks (`on ${engine}, …`).
 */
function testNamesIn(file: string, source: string): Set<string> {
  const sf = ts.createSourceFile(file, source, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
  const names = new Set<string>();
  const visit = (n: ts.Node): void => {
    if (
      ts.isCallExpression(n) &&
      ts.isIdentifier(n.expression) &&
      ["test", "it", "describe"].includes(n.expression.text) &&
      n.arguments[0]
    ) {
      const a = n.arguments[0];
      if (ts.isStringLiteralLike(a)) names.add(a.text);
      else if (ts.isTemplateExpression(a)) names.add(a.getText(sf).slice(1, -1));
    }
    ts.forEachChild(n, visit);
  };
  visit(sf);
  return names;
}

function tsFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) {
      if (e.name !== "node_modules") out.push(...tsFiles(p));
    } else if (e.name.endsWith(".ts") && !e.name.endsWith(".d.ts")) out.push(p);
  }
  return out;
}

function allCitations(): Citation[] {
  return SCANNED.flatMap((d) => tsFiles(path.join(ROOT, d))).flatMap((f) =>
    citationsIn(path.relative(ROOT, f), fs.readFileSync(f, "utf8")),
  );
}

interface Definition {
  id: string;
  line: number;
  body: string[];
}

/** The definitions in a RULES.md text, in order (duplicates kept, so they can be reported). */
function definitionsIn(md: string): Definition[] {
  const defs: Definition[] = [];
  let cur: Definition | null = null;
  md.split("\n").forEach((l, i) => {
    const m = DEF_HEADING.exec(l);
    if (m) {
      cur = { id: m[1], line: i + 1, body: [] };
      defs.push(cur);
      return;
    }
    if (/^#{1,6} /.test(l)) {
      cur = null;
      return;
    }
    cur?.body.push(l);
  });
  return defs;
}

/** Citations whose id has no definition, as "file:line: id" lines. */
function undefinedCitations(cites: Citation[], defined: Set<string>): string[] {
  return cites.filter((c) => !defined.has(c.id)).map((c) => `${c.file}:${c.line}: ${c.id}`);
}

function readRules(): string {
  assert.ok(fs.existsSync(RULES_MD), `${path.relative(ROOT, RULES_MD)} is missing`);
  return fs.readFileSync(RULES_MD, "utf8");
}

test("the pattern finds ids in comments and literals only, standing alone, and names file and line", () => {
  const undef = "K" + "99"; // built, so that this file itself cites nothing undefined
  const src = [
    "// K4 stops the run; M1–M7 and R2-R4 are ranges",
    `const B1 = 0.9, x = 0xB1, h = "00ab12B1ff", t = "T1 p2 d4 P0 K123 M10x", e = "${undef}";`,
    "/** a JSDoc block citing G10 */",
    // biome-ignore lint/suspicious/noTemplateCurlyInString: source text under test, not a template
    "const s = `segment ${B1} skips validation (G1)`; const re = / \\[M7\\]$/;",
    "if (n) { /* trailing D6 */ }",
    `throw new UserError("${"Z" + "7"}", "no"); class E { readonly rule = "${"Q" + "3"}"; } const o = { rule: "K5" };`,
  ].join("\n");
  const got = citationsIn("x.ts", src).map((c) => `${c.line}:${c.id}`);
  assert.deepEqual(got, [
    "1:K4",
    "1:M1",
    "1:M7",
    "1:R2",
    "1:R4",
    `2:${undef}`,
    "3:G10",
    "4:G1",
    "4:M7",
    "5:D6",
    `6:${"Z" + "7"}`,
    `6:${"Q" + "3"}`,
    "6:K5",
  ]);
  assert.deepEqual(
    undefinedCitations(citationsIn("src/x.ts", src), new Set(["K4", "M1", "M7", "R2", "R4", "G10", "G1", "D6", "K5"])),
    [`src/x.ts:2: ${undef}`, `src/x.ts:6: ${"Z" + "7"}`, `src/x.ts:6: ${"Q" + "3"}`],
  );
});

test("test names are read from test(), it() and describe() calls, a template as written", () => {
  const src =
    // biome-ignore lint/suspicious/noTemplateCurlyInString: source text under test, not a template
    'describe("suite (K4)", () => { for (const e of ["a"]) test(`on ${e}, works (M6)`, () => {}); it("plain", () => {}); });';
  // biome-ignore lint/suspicious/noTemplateCurlyInString: the name as written in the source
  assert.deepEqual([...testNamesIn("x.test.ts", src)].sort(), ["on ${e}, works (M6)", "plain", "suite (K4)"]);
});

test("a definition is a '### ID — title' heading; another heading ends its body", () => {
  const md = "# Rules\n### K4 — stop\n**Rule.** a\n## K\n### K4 stop\n### K5 — x\nbody\n";
  assert.deepEqual(
    definitionsIn(md).map((d) => [d.id, d.line, d.body]),
    [
      ["K4", 2, ["**Rule.** a"]],
      ["K5", 6, ["body", ""]],
    ],
  );
});

test("every rule id cited in src/, test/ and bench/ is defined in docs/RULES.md", () => {
  const defined = new Set(definitionsIn(readRules()).map((d) => d.id));
  const cites = allCitations();
  assert.ok(cites.length > 100, `only ${cites.length} citations found: the scanner is broken`);
  const missing = undefinedCitations(cites, defined);
  assert.deepEqual(
    missing,
    [],
    `ids cited but not defined in docs/RULES.md (add a '### ID — title' entry):\n${missing.join("\n")}`,
  );
});

test("docs/RULES.md defines each id once, each with its rule, its reason and its tests", () => {
  const defs = definitionsIn(readRules());
  assert.ok(defs.length > 0, "no definitions found");
  const lines = new Map<string, number[]>();
  for (const d of defs) lines.set(d.id, [...(lines.get(d.id) ?? []), d.line]);
  const twice = [...lines].filter(([, l]) => l.length > 1).map(([id, l]) => `${id} at lines ${l.join(", ")}`);
  assert.deepEqual(twice, [], `ids defined more than once in docs/RULES.md:\n${twice.join("\n")}`);
  const incomplete: string[] = [];
  for (const d of defs) {
    for (const part of ["**Rule.**", "**Why.**", "**Tests.**"]) {
      if (!d.body.some((l) => l.startsWith(part) && l.length > part.length + 1))
        incomplete.push(`${d.id} (line ${d.line}) lacks ${part}`);
    }
  }
  assert.deepEqual(incomplete, []);
});

test("every test docs/RULES.md names exists, in the file it names", () => {
  const bad: string[] = [];
  let named = 0;
  for (const d of definitionsIn(readRules())) {
    const para: string[] = [];
    for (const l of d.body.slice(d.body.findIndex((l) => l.startsWith("**Tests.**")))) {
      if (para.length > 0 && l.trim() === "") break;
      para.push(l);
    }
    const text = para.join(" ").replace(/^\*\*Tests\.\*\*\s*/, "");
    if (/^none\b/.test(text)) continue;
    const listed = new Set<string>();
    const parts = text.split(/`([^`]+\.test\.ts)`/);
    if (parts.length < 3) {
      bad.push(`${d.id}: the Tests paragraph names no test file and does not start with "none"`);
      continue;
    }
    for (let i = 1; i < parts.length; i += 2) {
      const file = path.join(ROOT, "test", parts[i].replace(/^test\//, ""));
      if (!fs.existsSync(file)) {
        bad.push(`${d.id}: ${parts[i]} does not exist`);
        continue;
      }
      const known = testNamesIn(file, fs.readFileSync(file, "utf8"));
      // A name ends at a quote followed by ";", "." or "," and a space (or the end): a name may hold quotes itself.
      const names = [...parts[i + 1].matchAll(/"(.+?)"(?=[;.,]?(?:\s|$))/g)].map((m) => m[1]);
      if (names.length === 0) bad.push(`${d.id}: no test name quoted after ${parts[i]}`);
      for (const n of names) {
        named++;
        const key = `${parts[i]}\u0000${n}`;
        if (listed.has(key)) bad.push(`${d.id}: names "${n}" of ${parts[i]} twice`);
        listed.add(key);
        if (!known.has(n))
          bad.push(
            `${d.id}: ${parts[i]} has no test named "${n}" (renamed or removed? update ${d.id}'s Tests paragraph in docs/RULES.md)`,
          );
      }
    }
  }
  assert.ok(named > 0, "no test names found");
  assert.deepEqual(bad, []);
});
