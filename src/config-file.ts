/**
 * `--config FILE` (G12): the file's syntax only. A `.json` file is read as JSON (a run's run_config.json), any
 * other as TOML (smol-toml); either way the answer is its top-level keys and values, in order. What a key means
 * and whether its value fits are config.ts's to say: there is one validated config, and this is not a second one.
 */
import * as fs from "node:fs";
import { parse } from "smol-toml";
import { fsRefusal, UserError } from "./errors";

export interface ConfigFileDoc {
  /** The path as given to --config. */
  file: string;
  format: "toml" | "json";
  entries: Array<[key: string, value: unknown]>;
}

export function readConfigFile(file: string): ConfigFileDoc {
  let text: string;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (e) {
    const r = fsRefusal(e, "G12");
    if (!r) throw e;
    throw new UserError("G12", `--config ${file}: ${r.message.replace(/ \[G12\]$/, "")}`);
  }
  const format = file.toLowerCase().endsWith(".json") ? "json" : "toml";
  const doc = format === "json" ? parseJson(file, text) : parseToml(file, text);
  return { file, format, entries: Object.entries(doc) };
}

function parseToml(file: string, text: string): Record<string, unknown> {
  try {
    // integers past 2^53 come back as BigInt, so that config.ts can refuse them instead of rounding them
    return parse(text, { integersAsBigInt: "asNeeded" }) as Record<string, unknown>;
  } catch (e) {
    const x = e as { line?: unknown; column?: unknown; message?: unknown };
    if (typeof x.line !== "number") throw e;
    const what = String(x.message)
      .split("\n")[0]
      .replace(/^Invalid TOML document: /, "");
    throw new UserError(
      "G12",
      `--config ${file} is not valid TOML: line ${x.line}, column ${x.column}: ${what}. Fix that line (a setting is one line: micro-batch = 4)`,
    );
  }
}

function parseJson(file: string, text: string): Record<string, unknown> {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    if (isToml(text)) {
      const toml = `${file.replace(/\.json$/i, "")}.toml`;
      throw new UserError(
        "G12",
        `--config ${file} holds TOML, not JSON (a .json file is read as JSON): rename it to ${toml}`,
      );
    }
    const msg = (e as Error).message.split("\n")[0];
    const pos = /at position (\d+)/.exec((e as Error).message);
    const at = pos ? `line ${text.slice(0, Number(pos[1])).split("\n").length}: ` : "";
    throw new UserError("G12", `--config ${file} is not valid JSON: ${at}${msg}. Fix the file`);
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc))
    throw new UserError("G12", `--config ${file} holds JSON that is not an object of settings: fix the file`);
  return doc as Record<string, unknown>;
}

/** True when the text is a TOML document (one that is not JSON: a .json file written as TOML). */
function isToml(text: string): boolean {
  try {
    parse(text);
    return true;
  } catch {
    return false;
  }
}
