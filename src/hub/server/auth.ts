/**
 * Who may do what on the local Hub, as on the real one (L4): with no token configured the Hub is
 * open; with tokens configured, a request without a token may read public repos only, a read token
 * reads every repo, a write token also writes, and an unknown token is refused (401) everywhere.
 * An anonymous request for a private repo gets the real Hub's 401 RepoNotFound (it cannot tell a
 * private repo from a missing one).
 */
import * as fs from "node:fs";
import { UserError } from "../../errors";
import { HttpError } from "./http";

export type TokenRole = "read" | "write";
export interface HubToken {
  token: string;
  role: TokenRole;
  name?: string;
}
export type Access = "read" | "write" | "none";

/** A tokens file: `{"tokens": [{"token": "hf_…", "role": "read"|"write", "name": "ci"}]}`. The values
 *  are never printed: errors name the entry's index. */
export function loadTokensFile(file: string): HubToken[] {
  let v: { tokens?: unknown };
  try {
    v = JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (e) {
    throw new UserError(
      "L4",
      `--tokens ${file}: cannot read it as JSON (${(e as NodeJS.ErrnoException).code ?? "invalid JSON"})`,
    );
  }
  if (!v || !Array.isArray(v.tokens))
    throw new UserError("L4", `--tokens ${file}: expected {"tokens": [{"token": "hf_...", "role": "read"|"write"}]}`);
  return v.tokens.map((t: unknown, i: number) => checkToken(t, `--tokens ${file}: tokens[${i}]`));
}

export function checkToken(t: unknown, where: string): HubToken {
  const o = t as Partial<HubToken>;
  if (!o || typeof o.token !== "string" || !o.token.startsWith("hf_") || o.token.length < 8)
    throw new UserError("L4", `${where}: token must be a string starting with "hf_" (the client refuses others)`);
  if (o.role !== "read" && o.role !== "write") throw new UserError("L4", `${where}: role must be "read" or "write"`);
  return { token: o.token, role: o.role, name: typeof o.name === "string" ? o.name : undefined };
}

export class Auth {
  private readonly byToken = new Map<string, HubToken>();

  constructor(tokens: HubToken[]) {
    for (const t of tokens) this.byToken.set(t.token, t);
  }

  get open(): boolean {
    return this.byToken.size === 0;
  }

  /** The caller's token entry; null when anonymous. An unknown token throws 401. */
  identify(authorization: string | undefined): HubToken | null {
    const m = /^Bearer (.+)$/.exec(authorization ?? "");
    if (!m) return null;
    if (this.open) return { token: m[1], role: "write", name: "local" };
    const t = this.byToken.get(m[1]);
    if (!t) throw new HttpError(401, "Invalid credentials in Authorization header");
    return t;
  }

  /** Refuses the request unless `who` may do `need` on a repo that is private or not. */
  check(who: HubToken | null, need: Access, repoPrivate: boolean): void {
    if (need === "none" || this.open) return;
    if (!who) {
      if (need === "write") throw new HttpError(401, "You must be authenticated to do this (pass a write token)");
      if (repoPrivate) throw new HttpError(401, "Repository not found", "RepoNotFound");
      return;
    }
    if (need === "write" && who.role !== "write")
      throw new HttpError(403, "This token has the read role; writing needs a token with the write role");
  }
}
