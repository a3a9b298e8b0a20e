// K5: the token comes from HF_TOKEN and never appears in logs, files or errors.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { createRepo } from "@huggingface/hub";
import { startTestHub, writeFakeCheckpoint, pointerOf, type TestHub } from "./helpers/hub";
import { createHubClient } from "../src/hub/client";
import { scrubSecret } from "../src/hub/hub-errors";
import { publishCheckpoint } from "../src/hub/cycle";
import { resolveAutoResume } from "../src/hub/resume";
import { headerUnsafe, hubTokenProblem } from "../src/hub/token";

const SECRET = "hf_secretTOKENvalue0123456789abcdef";
const WRONG = "hf_wrongTOKENvalue9876543210fedcba";
let th: TestHub;
const savedEnv = process.env.HF_TOKEN;

before(async () => {
  th = await startTestHub({ token: SECRET });
  process.env.HF_TOKEN = SECRET;
});
after(async () => {
  if (savedEnv === undefined) delete process.env.HF_TOKEN;
  else process.env.HF_TOKEN = savedEnv;
  await th.close();
});

/** Every string an error can carry to a log: message, stack, cause, and the client's data. */
function errorText(e: unknown): string {
  const x = e as { message?: string; stack?: string; cause?: unknown; data?: unknown };
  return [
    String(x?.message),
    String(x?.stack),
    x?.cause ? errorText(x.cause) : "",
    JSON.stringify(x?.data ?? null),
  ].join("\n");
}

function filesUnder(dir: string): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...filesUnder(p));
    else out.push(p);
  }
  return out;
}

describe("Hub token (K5)", () => {
  test("the right token from HF_TOKEN works end to end and is written nowhere", async () => {
    const store = createHubClient({ hubUrl: th.url, repo: "tester/secret-run", repoType: "dataset" }); // token from the environment
    const logs: string[] = [];
    assert.deepEqual(await store.ensureRepo(), { created: true });
    const ck = writeFakeCheckpoint(path.join(th.tmp, "checkpoint-10"), { step: 10 });
    const r = await publishCheckpoint(store, {
      localDir: ck.dir,
      pathInRepo: ck.path_in_repo,
      pointer: pointerOf(ck),
      prune: false,
      minFreeGb: 0,
      log: (l) => logs.push(l),
    });
    assert.equal(r.ok, true);
    const res = await resolveAutoResume(store, {
      destDir: path.join(th.tmp, "resume"),
      log: (l) => logs.push(l),
      retryDelayMs: 10,
    });
    assert.equal(res.kind, "checkpoint");
    // Failures made with the right token carry no trace of it either.
    th.hub.setFaults({ status: { pointerRead: 500, commit: 500 } });
    const errors: unknown[] = [];
    await resolveAutoResume(store, {
      destDir: path.join(th.tmp, "resume2"),
      log: (l) => logs.push(l),
      retryDelayMs: 10,
    }).catch((e) => errors.push(e));
    const ck2 = writeFakeCheckpoint(path.join(th.tmp, "checkpoint-20"), { step: 20 });
    // 500 is transient (K6): retried, each failure logged, until the (shortened) give-up time.
    await publishCheckpoint(store, {
      localDir: ck2.dir,
      pathInRepo: ck2.path_in_repo,
      pointer: pointerOf(ck2),
      prune: false,
      minFreeGb: 0,
      log: (l) => logs.push(l),
      giveUpMs: 300,
      backoff: { baseMs: 10, capMs: 20 },
    }).catch((e) => errors.push(e));
    th.hub.clearFaults();
    assert.equal(errors.length, 2);
    for (const e of errors) assert.ok(!errorText(e).includes(SECRET), "an error leaks the token");
    for (const l of logs) assert.ok(!l.includes(SECRET), `log line leaks the token: ${l.replace(SECRET, "<SECRET>")}`);
    for (const f of filesUnder(th.tmp)) assert.ok(!fs.readFileSync(f).includes(SECRET), `${f} holds the token`);
  });

  test("a request without the token gets a 401 for a private repo", async () => {
    await createRepo({
      repo: { type: "dataset", name: "tester/private-run" },
      private: true,
      accessToken: SECRET,
      hubUrl: th.url,
    });
    const res = await fetch(`${th.url}/api/datasets/tester/private-run`);
    assert.equal(res.status, 401);
    assert.ok(!(await res.text()).includes(SECRET));
  });

  test("a wrong token gets a clear 401 error that does not contain the token", async () => {
    const store = createHubClient({ hubUrl: th.url, repo: "tester/secret-run", repoType: "dataset", token: WRONG });
    const errors: unknown[] = [];
    await assert.rejects(store.repoExists(), (e: Error) => {
      errors.push(e);
      assert.equal(e.name, "HubLookupError");
      assert.match(e.message, /the Hub rejected the token \(401\)/);
      return true;
    });
    await assert.rejects(store.list(), (e: Error & { statusCode?: number }) => {
      errors.push(e);
      assert.equal(e.statusCode, 401);
      assert.match(e.message, /Invalid credentials in Authorization header/);
      return true;
    });
    await assert.rejects(
      resolveAutoResume(store, { destDir: path.join(th.tmp, "r2"), log: () => {}, retryDelayMs: 10 }),
      (e: Error) => {
        errors.push(e);
        assert.match(e.message, /could not read latest\.json on tester\/secret-run: HTTP 401/);
        return true;
      },
    );
    for (const e of errors) {
      assert.ok(!errorText(e).includes(WRONG), "the wrong token leaks into an error");
      assert.ok(!errorText(e).includes(SECRET), "the right token leaks into an error");
    }
  });

  test("scrubSecret removes every occurrence of the token from a text", () => {
    assert.equal(
      scrubSecret(`Authorization: Bearer ${SECRET}; again ${SECRET}`, SECRET),
      "Authorization: Bearer hf_***; again hf_***",
    );
    assert.equal(scrubSecret("nothing here", undefined), "nothing here");
  });

  test("a token holding a character an HTTP header cannot carry is refused without showing it, saying which kind", () => {
    const cases: Array<[token: string, kind: string]> = [
      [`${SECRET}\n`, "a line break, LF, as its last character"],
      [`${SECRET.slice(0, 5)}\r${SECRET.slice(5)}`, `a carriage return, CR, at character 6 of ${SECRET.length + 1}`],
      [`${SECRET}\u0000x`, `a control character, U+0000, at character ${SECRET.length + 1} of ${SECRET.length + 2}`],
      [`${SECRET}\u2028`, "a character beyond Latin-1, as its last character"],
    ];
    for (const [token, kind] of cases) {
      assert.equal(headerUnsafe(token), kind);
      assert.throws(
        () => createHubClient({ hubUrl: th.url, repo: "tester/secret-run", repoType: "dataset", token }),
        (e: Error & { rule?: string }) => {
          assert.equal(e.name, "UserError");
          assert.equal(e.rule, "K5");
          assert.equal(
            e.message,
            `the Hub token (HF_TOKEN) holds a character an HTTP header cannot carry (${kind}), so no request can send it; set HF_TOKEN to a Hugging Face access token [K5]`,
          );
          assert.ok(!errorText(e).includes(SECRET.slice(3)), "the token is shown");
          return true;
        },
      );
    }
    assert.equal(hubTokenProblem(SECRET), null);
    assert.equal(hubTokenProblem(undefined), null);
    assert.equal(hubTokenProblem(""), null);
  });

  test("a token that does not start with hf_ is refused without showing it", () => {
    assert.throws(
      () =>
        createHubClient({
          hubUrl: th.url,
          repo: "tester/secret-run",
          repoType: "dataset",
          token: "ghp_notahftoken123",
        }),
      (e: Error & { rule?: string }) => {
        assert.equal(e.name, "UserError");
        assert.equal(e.rule, "K5");
        assert.match(e.message, /does not start with "hf_"/);
        assert.ok(!e.message.includes("ghp_notahftoken123"));
        return true;
      },
    );
  });
});
