/**
 * HF_TOKEN's form (K5), in words that never show it: a character an HTTP header cannot carry (a line break
 * from `cat token.txt`, a control character, anything beyond Latin-1) would fail every request to the Hub,
 * and a token without `hf_` is refused by the Hub client. A run checks it at start, before any work, with
 * advice that works where it runs: with the embedded local Hub, which needs no token, to unset it. prepare's
 * hf:// inputs and generate's hf:// models are checked the same way before their first request.
 */
import { UserError } from "../errors";

/** The first character of `token` an HTTP header cannot carry, in words (not the token), or null. */
export function headerUnsafe(token: string): string | null {
  const at = token.search(/[^\t\x20-\x7e\x80-\xff]/);
  if (at < 0) return null;
  const c = token.charCodeAt(at);
  const kind =
    c === 0x0a
      ? "a line break, LF"
      : c === 0x0d
        ? "a carriage return, CR"
        : c > 0xff
          ? "a character beyond Latin-1"
          : `a control character, U+${c.toString(16).toUpperCase().padStart(4, "0")}`;
  return `${kind}, ${at === token.length - 1 ? "as its last character" : `at character ${at + 1} of ${token.length}`}`;
}

/** What makes a Hub token unusable, as the middle of a refusal that names HF_TOKEN; null when it is usable or unset. */
export function hubTokenProblem(token: string | undefined): string | null {
  if (token === undefined || token === "") return null;
  const bad = headerUnsafe(token);
  if (bad)
    return `the Hub token (HF_TOKEN) holds a character an HTTP header cannot carry (${bad}), so no request can send it`;
  if (!token.startsWith("hf_"))
    return `the Hub token (HF_TOKEN) does not start with "hf_", so the Hub client would refuse it`;
  return null;
}

/**
 * K5 at the start of a run that talks to a Hub (`embeddedWithout`: the local Hub in this process): a malformed
 * HF_TOKEN is refused before any work, with the command that works here. The local Hub needs no token, so
 * the advice there is to run the same command without it; a remote Hub needs the token alone.
 */
export function refuseMalformedToken(
  o: {
    /** With the embedded local Hub: the same command run without HF_TOKEN (`env -u HF_TOKEN node dist/main.js …`). */
    embeddedWithout?: string;
    /** Only reads (prepare's hf:// inputs, generate's hf:// models): a public repo reads without a token. */
    readsOnly?: boolean;
  },
  token: string | undefined = process.env.HF_TOKEN,
): void {
  const problem = hubTokenProblem(token);
  if (!problem) return;
  if (o.embeddedWithout)
    throw new UserError(
      "K5",
      `${problem}; the embedded local Hub needs no token: run it without, as in ${o.embeddedWithout}`,
    );
  const fix =
    token && headerUnsafe(token)
      ? `set HF_TOKEN to the token alone (hf_ then letters and digits), as in export HF_TOKEN="$(printf %s "$HF_TOKEN" | tr -cd '[:alnum:]_')"`
      : `set HF_TOKEN to a Hugging Face access token${o.readsOnly ? ", or unset it (unset HF_TOKEN) to read a public repo" : ""}`;
  throw new UserError("K5", `${problem}; ${fix}`);
}
