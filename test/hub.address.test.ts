// The Hub's address, said once (hub/address.ts): --hub-url, then HF_ENDPOINT, then the Hugging Face Hub, for the
// trainer, generate and prepare; the one hf:// grammar (generate's @revision included); the repo id and repo path rules
// that the client and the local Hub both hold to.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as http from "node:http";
import type * as net from "node:net";
import * as path from "node:path";
import { commit } from "@huggingface/hub";
import { DEFAULT_HUB_URL, hubEndpoint, hubUrlProblem, isRepoPath, parseHfUrl } from "../src/hub/address";
import { FLAGS } from "../src/config";
import { startTestHub } from "./helpers/hub";
import { tinyRun } from "./helpers/run";
import { writeSyntheticMix } from "./helpers/mix";
import { tinyModel } from "./helpers/model-dir";
import { tmpDir } from "./helpers/tmp";
import { type Output, spawnOutput } from "./helpers/cli";
import { writeTinyTokenizer } from "./fixtures/data-synth";
import { corpusDocs, corpusJsonl } from "./fixtures/corpus-docs";

const ROOT = path.join(__dirname, "..", "..");

/** `node dist/<file> args` in the repository root, without blocking this process (the test Hub serves in it). */
function run(file: string, args: string[], env: NodeJS.ProcessEnv): Promise<Output> {
  return spawnOutput(process.execPath, [path.join("dist", file), ...args], { cwd: ROOT, env });
}

/** The environment without a Hub address or token of the caller's. */
function cleanEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env = { ...process.env, ...extra };
  if (!("HF_ENDPOINT" in extra)) delete env.HF_ENDPOINT;
  delete env.HF_TOKEN;
  return env;
}

test("the default Hub address is the flag table's, and --hub-url, then HF_ENDPOINT, then it is the endpoint", () => {
  assert.equal(DEFAULT_HUB_URL, FLAGS.find((f) => f.flag === "hub-url")!.def);
  assert.deepEqual(hubEndpoint(undefined, "G11", {}), { url: DEFAULT_HUB_URL, from: "default" });
  assert.deepEqual(hubEndpoint(undefined, "G11", { HF_ENDPOINT: "" }), { url: DEFAULT_HUB_URL, from: "default" });
  assert.deepEqual(hubEndpoint(undefined, "G11", { HF_ENDPOINT: "HTTP://Mirror.Example:80/" }), {
    url: "http://mirror.example",
    from: "HF_ENDPOINT",
  });
  assert.deepEqual(hubEndpoint("http://127.0.0.1:9/hub/", "G11", { HF_ENDPOINT: "http://other" }), {
    url: "http://127.0.0.1:9/hub",
    from: "--hub-url",
  });
  assert.throws(
    () => hubEndpoint(undefined, "D2", { HF_ENDPOINT: "mirror.example" }),
    /^UserError: HF_ENDPOINT "mirror\.example" is not an http\(s\) URL such as https:\/\/huggingface\.co; set it to a Hub's address \(export HF_ENDPOINT=https:\/\/huggingface\.co\) or unset it \(unset HF_ENDPOINT\) \[D2\]$/,
  );
  // a user and password would be printed in every start line; a query or fragment breaks every route
  assert.match(hubUrlProblem("https://me:hf_x@hub.example")!, /user name or password/);
  assert.match(hubUrlProblem("https://hub.example/?x=1")!, /query or fragment/);
  assert.match(hubUrlProblem("https://hub.example#top")!, /query or fragment/);
  assert.match(hubUrlProblem("ftp://hub.example")!, /is not an http\(s\) URL/);
  assert.equal(hubUrlProblem("https://hub.example/prefix"), null, "a Hub behind a proxy may live under a path");
});

test("hf:// is parsed by one grammar: repo type, repo id, @revision (URL-encoded) and the path", () => {
  const o = { what: "--model", rule: "G11", form: "hf://datasets/owner/name[@revision]/path" };
  assert.deepEqual(parseHfUrl("hf://models/o/n@v1.0/final/", o), {
    repoType: "model",
    repo: "o/n",
    revision: "v1.0",
    path: "final",
  });
  assert.deepEqual(parseHfUrl("hf://datasets/o/n@refs%2Fpr%2F1", o), {
    repoType: "dataset",
    repo: "o/n",
    revision: "refs/pr/1",
    path: "",
  });
  const refused = (s: string, re: RegExp, extra = {}) =>
    assert.throws(
      () => parseHfUrl(s, { ...o, ...extra }),
      (e: Error & { rule?: string }) => e.rule === "G11" && re.test(e.message),
    );
  refused("hf://spaces/o/n/x", /is not a Hub URL of the form hf:\/\/datasets\/owner\/name\[@revision\]\/path/);
  refused("hf://datasets/o/-n/x", /"o\/-n" is not a Hub repo id/);
  refused("hf://datasets/o/n@/x", /empty revision after "@"/);
  refused("hf://datasets/o/n@%E0/x", /is not valid URL encoding/);
  refused("hf://datasets/o/n/a/../b", /must be a relative path inside the repo/);
  refused("hf://datasets/o/n//b", /must be a relative path inside the repo/);
  refused("hf://datasets/o/n@main", /names no path in the repo: name the folder/, { needPath: "name the folder" });
});

test("the client and the local Hub hold to one repo path rule", async () => {
  for (const [p, ok] of [
    ["a/b.txt", true],
    ["", false],
    ["/a", false],
    ["a//b", false],
    ["a/./b", false],
    ["a/..", false],
  ] as const)
    assert.equal(isRepoPath(p), ok, p);
  const th = await startTestHub({ repo: "me/paths" });
  try {
    const store = th.store();
    await store.ensureRepo();
    // the client refuses before any request; the local Hub refuses the same path from a caller without that check
    await assert.rejects(store.download("a/../b"), /path must be a relative path inside the repo/);
    await assert.rejects(
      commit({
        repo: { type: "dataset", name: "me/paths" },
        hubUrl: th.url,
        title: "a bad path",
        operations: [{ operation: "addOrUpdate", path: "a/./b.txt", content: new Blob(["x"]) }],
      }),
      /invalid path in repo: "a\/\.\/b\.txt": it must be a relative path inside the repo/,
    );
  } finally {
    await th.close();
  }
});

test("HF_ENDPOINT, with no --hub-url, is the Hub of the trainer, of generate and of prepare; --demo keeps its embedded Hub unless --hub-url (G10, G11, D2, B6)", {
  timeout: 600_000,
}, async () => {
  const th = await startTestHub({ repo: "me/models" });
  try {
    const env = cleanEnv({ HF_ENDPOINT: th.url });
    // the trainer: checkpoints land on that Hub, and the start line says where its address came from
    const mix = writeSyntheticMix({ vocab: 64, trainTokens: 32 * 1024, valTokens: 512 });
    const out = tmpDir("tstrain-endpoint-run-");
    const r = await run(
      "main.js",
      tinyRun(mix.root, out, ["--hub-repo", "me/env-run", "--hub-retry-minutes", "0.1"]),
      env,
    );
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, new RegExp(`from HF_ENDPOINT: hub-url="${th.url.replace(/[.]/g, "\\.")}"`));
    const ptr = await th.store({ repo: "me/env-run" }).readPointer();
    assert.equal(ptr?.path_in_repo, "final", "the run published to the Hub HF_ENDPOINT names");
    // --demo runs offline on its embedded Hub (B6), whatever HF_ENDPOINT says (a mirror of the real Hub, say), and
    // says so; --hub-url sends it to that Hub
    const demoRoot = tmpDir("tstrain-endpoint-demo-data-");
    const before = th.hub.requests.length;
    const demoArgs = ["--demo", "--dry-run", "--root", demoRoot];
    const demo = await run("main.js", [...demoArgs, "--out", tmpDir("tstrain-endpoint-demo-")], env);
    assert.equal(demo.status, 0, demo.stderr);
    assert.match(demo.stdout, /embedded local Hub/);
    assert.match(demo.stdout, /HF_ENDPOINT is set, and --demo keeps its embedded Hub/);
    assert.equal(th.hub.requests.length, before, "the demo asked HF_ENDPOINT's Hub nothing");
    const sent = await run(
      "main.js",
      [...demoArgs, "--out", tmpDir("tstrain-endpoint-demo-"), "--hub-url", th.url],
      env,
    );
    assert.equal(sent.status, 0, sent.stderr);
    assert.doesNotMatch(sent.stdout, /embedded local Hub/);
    assert.ok(
      th.hub.requests.slice(before).some((q) => q.path.includes("local/tstrain-demo")),
      "with --hub-url the demo asked that Hub about its repo",
    );

    // generate: an hf:// model from that Hub
    const models = th.store({ repo: "me/models" });
    await models.ensureRepo();
    await models.uploadFolder(tinyModel(7), "final", "a model");
    const gen = ["--prompt", "The", "--max-new-tokens", "6", "--backend", "cpu"];
    const g = await run("generate.js", ["--model", "hf://datasets/me/models/final", ...gen], env);
    assert.equal(g.status, 0, g.stderr);
    assert.match(g.stdout, /^The/);

    // prepare: an hf:// input from that Hub
    const work = tmpDir("tstrain-endpoint-prepare-");
    fs.mkdirSync(path.join(work, "corpus"));
    fs.writeFileSync(path.join(work, "corpus", "c.jsonl"), corpusJsonl());
    const corpus = th.store({ repo: "me/corpus" });
    await corpus.ensureRepo();
    await corpus.uploadFolder(path.join(work, "corpus"), "data", "the corpus");
    const tok = writeTinyTokenizer(
      path.join(work, "tok"),
      corpusDocs().filter((d) => d.length > 0),
    );
    const args = ["--input", "hf://datasets/me/corpus/data/*.jsonl", "--tokenizer", tok, "--workers", "1"];
    const p = await run("prepare.js", [...args, "--out", path.join(work, "mix")], env);
    assert.equal(p.status, 0, p.stderr);
    const manifest = JSON.parse(fs.readFileSync(path.join(work, "mix", "manifest.json"), "utf8"));
    assert.equal(manifest.sources[0].repo, "me/corpus");
  } finally {
    await th.close();
  }
});

test("generate reads an hf:// model at the @revision it names: a commit id, a branch (G11)", {
  timeout: 300_000,
}, async () => {
  const th = await startTestHub({ repo: "me/revs" });
  try {
    const env = cleanEnv();
    const gen = (model: string) =>
      run(
        "generate.js",
        [
          ...["--model", model, "--prompt", "The", "--max-new-tokens", "8", "--backend", "cpu"],
          ...["--temperature", "1", "--seed", "3", "--hub-url", th.url], // sampled: greedy repeats one token on both
        ],
        env,
      );
    const [m7, m8] = [tinyModel(7), tinyModel(8)];
    const [t7, t8] = [(await gen(m7)).stdout, (await gen(m8)).stdout];
    assert.notEqual(t7, t8, "the two models write different texts");
    const store = th.store();
    await store.ensureRepo();
    await store.uploadFolder(m7, "final", "model 7");
    const first = await store.head();
    await store.uploadFolder(m8, "final", "model 8");
    assert.ok(first && first !== (await store.head()));
    const old = await gen(`hf://datasets/me/revs@${first}/final`);
    assert.equal(old.status, 0, old.stderr);
    assert.equal(old.stdout, t7, "the model as it was at that commit");
    const main = await gen("hf://datasets/me/revs@main/final");
    assert.equal(main.status, 0, main.stderr);
    assert.equal(main.stdout, t8, "the model on main");
    const none = await gen("hf://datasets/me/revs@no-such-branch/final");
    assert.equal(none.status, 2, none.stderr);
    assert.match(
      none.stderr,
      /^generate: --model hf:\/\/datasets\/me\/revs@no-such-branch\/final: could not download/m,
    );
  } finally {
    await th.close();
  }
});

test("prepare and generate name an address that is a web server, not a Hub (D2, G11)", {
  timeout: 300_000,
}, async () => {
  const web = http.createServer((_req, res) => {
    res.writeHead(404, { "Content-Type": "text/html" });
    res.end("<html><body>File not found</body></html>");
  });
  await new Promise<void>((resolve) => web.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${(web.address() as net.AddressInfo).port}`;
  try {
    const env = cleanEnv({ HF_ENDPOINT: url });
    const work = tmpDir("tstrain-not-a-hub-reads-");
    const tok = writeTinyTokenizer(
      path.join(work, "tok"),
      corpusDocs().filter((d) => d.length > 0),
    );
    const p = await run(
      "prepare.js",
      ["--input", "hf://datasets/me/corpus/*.jsonl", "--tokenizer", tok, "--out", path.join(work, "mix")],
      env,
    );
    assert.equal(p.status, 2, p.stderr);
    assert.match(
      p.stderr,
      /^prepare: --input hf:\/\/datasets\/me\/corpus\/\*\.jsonl: the Hub address is not a Hub: GET http:\S+ answered 404 \(text\/html\), as a web server does, not as a Hub.*; name a Hub with --hub-url \(or HF_ENDPOINT\), as https:\/\/huggingface\.co \[D2\]$/m,
    );
    const g = await run("generate.js", ["--model", "hf://datasets/me/models/final", "--prompt", "The"], env);
    assert.equal(g.status, 2, g.stderr);
    assert.match(
      g.stderr,
      /^generate: --model hf:\/\/datasets\/me\/models\/final: could not download it \(GET http:\S+ answered 404 \(text\/html\), as a web server does, not as a Hub.*\); check the path, --hub-url and HF_TOKEN \[G11\]$/m,
    );
  } finally {
    web.close();
  }
});

test("an hf:// model that cannot be downloaded is refused with a command that runs: the repo's own type, or a folder of it that holds a model (G11)", {
  timeout: 300_000,
}, async () => {
  const th = await startTestHub({ repo: "me/advised" });
  try {
    const store = th.store();
    await store.ensureRepo();
    await store.uploadFolder(tinyModel(7), "ckpt/checkpoint-4", "a checkpoint");
    await store.uploadFolder(tinyModel(7), "final", "the model");
    const env = cleanEnv({ HF_ENDPOINT: th.url });
    const gen = ["--prompt", "The", "--max-new-tokens", "2", "--backend", "cpu"];
    for (const [model, advice] of [
      ["hf://models/me/advised/final", /me\/advised is a dataset repo, not a model one: generate from it with /],
      [
        "hf://datasets/me/advised/final/model.safetensors",
        /the folders of me\/advised that hold a model are final, ckpt\/checkpoint-4: generate from one, as in /,
      ],
      [
        "hf://datasets/me/advised/nothere",
        /the folders of me\/advised that hold a model are final, ckpt\/checkpoint-4: generate from one, as in /,
      ],
    ] as const) {
      const bad = await run("generate.js", ["--model", model, ...gen], env);
      assert.equal(bad.status, 2, bad.stderr);
      assert.match(
        bad.stderr,
        new RegExp(
          `^generate: --model ${model.replace(/[.]/g, "\\.")}: could not download it .*; ${advice.source}node dist/generate\\.js .* \\[G11\\]$`,
          "m",
        ),
      );
      const cmd = /(?:with|as in) node dist\/generate\.js (.*) \[G11\]$/m.exec(bad.stderr)?.[1] ?? "";
      const ok = await run("generate.js", cmd.split(" "), env);
      assert.equal(ok.status, 0, ok.stderr);
      assert.match(ok.stdout, /^The/);
    }
  } finally {
    await th.close();
  }
});
