// Private and public repos, read and write tokens on the local Hub (L4), through the real client.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { commit, createRepo, downloadFile, listFiles, repoExists, whoAmI, HubApiError } from "@huggingface/hub";
import { startTestHub, type TestHub } from "./helpers/hub";
import { loadTokensFile } from "../src/hub/server";

const WRITE = "hf_writeTokenOfTheLocalHub000001";
const READ = "hf_readTokenOfTheLocalHub0000002";
const STRANGER = "hf_unknownTokenOfNobody000000003";
let th: TestHub;
const priv = { type: "dataset" as const, name: "auth/private" };
const pub = { type: "dataset" as const, name: "auth/public" };
const put = (p: string, t: string) => ({ operation: "addOrUpdate" as const, path: p, content: new Blob([t]) });
const status = (code: number) => (e: HubApiError) => e instanceof HubApiError && e.statusCode === code;

before(async () => {
  th = await startTestHub({
    tokens: [
      { token: WRITE, role: "write", name: "trainer" },
      { token: READ, role: "read", name: "reader" },
    ],
  });
  for (const r of [priv, pub]) {
    await createRepo({ repo: r, hubUrl: th.url, accessToken: WRITE, private: r === priv });
    await commit({ repo: r, hubUrl: th.url, accessToken: WRITE, title: "data", operations: [put("a.txt", r.name)] });
  }
});
after(async () => {
  await th.close();
});

describe("private repos and token roles (L4)", () => {
  test("a private repo's reads are refused without a token, as the real Hub does (401, not found)", async () => {
    await assert.rejects(downloadFile({ repo: priv, path: "a.txt", hubUrl: th.url }), status(401));
    await assert.rejects(async () => {
      for await (const _ of listFiles({ repo: priv, hubUrl: th.url })) void _;
    }, status(401));
    assert.equal(await repoExists({ repo: priv, hubUrl: th.url }), false);
  });

  test("a public repo reads without a token; writing to it needs one", async () => {
    assert.equal(await (await downloadFile({ repo: pub, path: "a.txt", hubUrl: th.url }))!.text(), "auth/public");
    const res = await fetch(`${th.url}/api/datasets/${pub.name}/commit/main`, {
      method: "POST",
      body: '{"key":"header","value":{"summary":"x"}}',
    });
    assert.equal(res.status, 401);
  });

  test("a read token reads the private repo but cannot commit or create repos (403)", async () => {
    assert.equal(
      await (await downloadFile({ repo: priv, path: "a.txt", hubUrl: th.url, accessToken: READ }))!.text(),
      "auth/private",
    );
    await assert.rejects(
      commit({ repo: priv, hubUrl: th.url, accessToken: READ, title: "nope", operations: [put("b.txt", "x")] }),
      status(403),
    );
    await assert.rejects(
      createRepo({ repo: { type: "dataset", name: "auth/by-reader" }, hubUrl: th.url, accessToken: READ }),
      status(403),
    );
    assert.equal((await whoAmI({ hubUrl: th.url, accessToken: READ })).auth.accessToken?.role, "read");
  });

  test("an unknown token is refused even on a public repo (401)", async () => {
    await assert.rejects(
      downloadFile({ repo: pub, path: "a.txt", hubUrl: th.url, accessToken: STRANGER }),
      status(401),
    );
    await assert.rejects(whoAmI({ hubUrl: th.url, accessToken: STRANGER }), status(401));
  });

  test("a tokens file gives each token a role; a bad entry is named by index, never by value", () => {
    const f = path.join(th.tmp, "tokens.json");
    fs.writeFileSync(
      f,
      JSON.stringify({
        tokens: [
          { token: WRITE, role: "write" },
          { token: READ, role: "read", name: "ci" },
        ],
      }),
    );
    assert.deepEqual(
      loadTokensFile(f).map((t) => t.role),
      ["write", "read"],
    );
    fs.writeFileSync(f, JSON.stringify({ tokens: [{ token: READ, role: "admin" }] }));
    assert.throws(
      () => loadTokensFile(f),
      (e: Error) => /tokens\[0\]: role must be "read" or "write"/.test(e.message) && !e.message.includes(READ),
    );
  });
});
