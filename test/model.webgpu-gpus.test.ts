/**
 * The webgpu engine's GPUs (src/model/engine/webgpu/gpus.ts, A13), without an adapter: the device-select layer's list
 * read and put in PCI address order; --gpus by index and by PCI address; each rank's GPU and how it is opened (its
 * PCI address, its vendor:device id, its name); more ranks than GPUs sharing them with a warning that gives the
 * mapping; a GPU that is not there refused with the list of those that are; --gpus's own refusals. The lists here are
 * written as Mesa's layer prints them (`MESA_VK_DEVICE_SELECT=list`) on a host of two H100s; test/train.webgpu-gpus
 * runs the same on lavapipe, once and loaded twice.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseArgs } from "../src/config";
import {
  type GpuListing,
  gpuWords,
  localProcess,
  orderGpus,
  parseDeviceList,
  planGpus,
} from "../src/model/engine/webgpu/gpus";

/** What the layer prints on a host of two H100s (in the loader's order, not the addresses') and lavapipe. */
const H100S = `selectable devices:
  GPU 0: 10de:2330 "NVIDIA H100 80GB HBM3" discrete GPU 0000:2a:00.0
  GPU 1: 10005:0 "llvmpipe (LLVM 15.0.6, 256 bits)" CPU 0000:00:00.0
  GPU 2: 10de:2330 "NVIDIA H100 80GB HBM3" discrete GPU 0000:17:00.0
`;
/** The same on this machine: lavapipe alone. */
const LAVAPIPE = `WARNING: lavapipe is not a conformant vulkan implementation, testing use only.
selectable devices:
  GPU 0: 10005:0 "llvmpipe (LLVM 15.0.6, 256 bits)" CPU
`;

function listing(text: string): Extract<GpuListing, { all: unknown }> {
  const d = parseDeviceList(text);
  assert.ok(d, "a list");
  return orderGpus(d);
}

const ALONE = { rank: 0, size: 1 };

test("the host's GPUs are listed in PCI address order, a software adapter only where no GPU is (A13)", () => {
  const l = listing(H100S);
  assert.deepEqual(
    l.gpus.map((g) => [g.index, g.pci, g.name]),
    [
      [0, "0000:17:00.0", "NVIDIA H100 80GB HBM3"],
      [1, "0000:2a:00.0", "NVIDIA H100 80GB HBM3"],
    ],
  );
  // lavapipe is passed over where a GPU is; its zero address (the layer prints one once any driver has them) is none
  assert.deepEqual(
    l.passed.map((g) => [g.name, g.pci]),
    [["llvmpipe (LLVM 15.0.6, 256 bits)", null]],
  );
  assert.equal(gpuWords(l.gpus[0]), 'GPU 0 0000:17:00.0 "NVIDIA H100 80GB HBM3"');
  const lvp = listing(LAVAPIPE);
  assert.deepEqual(
    lvp.gpus.map((g) => [g.index, g.vendorId, g.deviceId, g.type, g.pci]),
    [[0, 0x10005, 0, "CPU", null]],
  );
  assert.equal(gpuWords(lvp.gpus[0]), 'GPU 0 "llvmpipe (LLVM 15.0.6, 256 bits)" (no PCI address)');
  assert.equal(parseDeviceList("no layer here\n"), null, "no list without the layer");
});

test("--gpus chooses GPUs by index or PCI address; rank r takes the r-th; each is opened by its PCI address, else its id or its name (A13)", () => {
  const l = listing(H100S);
  const gpusOf = (world: number, choice: string, local = ALONE) =>
    planGpus(l, world, choice, local, {}).ranks.map((r) => r.index);
  assert.deepEqual(gpusOf(2, ""), [0, 1], "every GPU in PCI order");
  assert.deepEqual(gpusOf(2, "1,0"), [1, 0]);
  assert.deepEqual(gpusOf(1, "0000:2a:00.0"), [1]);
  assert.deepEqual(gpusOf(1, "2A:00.0"), [1], "an address as lspci prints it");
  assert.deepEqual(gpusOf(1, ""), [0]);
  // under an MPI launcher the host's processes take the GPUs in turn: process 1 of 2, one rank each
  assert.deepEqual(gpusOf(1, "", { rank: 1, size: 2 }), [1]);
  assert.deepEqual(localProcess({ OMPI_COMM_WORLD_LOCAL_RANK: "1", OMPI_COMM_WORLD_LOCAL_SIZE: "2" }), {
    rank: 1,
    size: 2,
  });
  assert.deepEqual(localProcess({}), ALONE);
  // a PCI address: the device-select layer shows that device alone
  const [r0] = planGpus(l, 1, "1", ALONE, {}).ranks;
  assert.deepEqual(r0.env, {
    MESA_VK_DEVICE_SELECT: null,
    DRI_PRIME: "pci-0000_2a_00_0!",
    MESA_VK_DEVICE_SELECT_FORCE_DEFAULT_DEVICE: null,
  });
  assert.equal(r0.adapter, null);
  assert.equal(r0.label, 'GPU 1 0000:2a:00.0 "NVIDIA H100 80GB HBM3"');
  // no address: a vendor:device id no other device has, else a name no other device's contains (Dawn's adapter=)
  const mixed = listing(`selectable devices:
  GPU 0: 10005:0 "llvmpipe (LLVM 15.0.6, 256 bits)" CPU
  GPU 1: 1ae0:c0de "SwiftShader Device (Subzero)" CPU
  GPU 2: 10005:0 "llvmpipX (LLVM 15.0.6, 256 bits)" CPU
`);
  const [a, b, c] = planGpus(mixed, 3, "", ALONE, {}).ranks;
  assert.equal(a.env.MESA_VK_DEVICE_SELECT, null);
  assert.equal(a.adapter, "llvmpipe (LLVM 15.0.6, 256 bits)");
  assert.equal(b.env.MESA_VK_DEVICE_SELECT, "1ae0:c0de!");
  assert.equal(b.adapter, null);
  assert.equal(c.adapter, "llvmpipX (LLVM 15.0.6, 256 bits)");
  // a name inside another device's name cannot pick it: Dawn's first adapter then
  const inside = listing(`selectable devices:
  GPU 0: 10005:0 "lvp" CPU
  GPU 1: 10005:0 "lvp 2" CPU
`);
  assert.deepEqual(
    planGpus(inside, 2, "", ALONE, {}).ranks.map((r) => r.adapter),
    [null, "lvp 2"],
  );
});

test("more ranks than GPUs share them, with a warning that gives the mapping; identical GPUs without an address are named (A13)", () => {
  const l = listing(H100S);
  const p = planGpus(l, 3, "", ALONE, {});
  assert.deepEqual(
    p.ranks.map((r) => r.index),
    [0, 1, 0],
  );
  assert.deepEqual(p.notes, [
    'WARNING 3 ranks on 2 GPUs: ranks share them: GPU 0 0000:17:00.0 "NVIDIA H100 80GB HBM3" <- ranks 0, 2; GPU 1 0000:2a:00.0 "NVIDIA H100 80GB HBM3" <- rank 1; each GPU\'s ranks take turns on it (A13)',
  ]);
  assert.deepEqual(planGpus(l, 2, "", ALONE, {}).notes, [], "one rank a GPU: nothing to say");
  // CI's lavapipe: --world 2 on its one device
  assert.match(
    planGpus(listing(LAVAPIPE), 2, "", ALONE, {}).notes.join("\n"),
    /^WARNING 2 ranks on 1 GPU: ranks share it: GPU 0 "llvmpipe \(LLVM 15\.0\.6, 256 bits\)" \(no PCI address\) <- ranks 0, 1;/,
  );
  // two identical devices without an address (lavapipe loaded twice) cannot be told apart
  const twins = listing(`selectable devices:
  GPU 0: 10005:0 "llvmpipe (LLVM 15.0.6, 256 bits)" CPU
  GPU 1: 10005:0 "llvmpipe (LLVM 15.0.6, 256 bits)" CPU
`);
  assert.deepEqual(planGpus(twins, 2, "", ALONE, {}).notes, [
    'WARNING GPU 0 and GPU 1 cannot be told apart ("llvmpipe (LLVM 15.0.6, 256 bits)", the same vendor:device id 10005:0, no PCI address): their ranks all open the first of them (A13)',
  ]);
  // the user's own device-select variables are set aside, said so
  assert.deepEqual(planGpus(l, 1, "", ALONE, { DRI_PRIME: "pci-0000_2a_00_0" }).notes, [
    "WARNING DRI_PRIME=pci-0000_2a_00_0 in the environment is set aside: each rank's GPU is chosen by --gpus (A13)",
  ]);
  // the GPUs not listed (no device-select layer): every rank on Dawn's choice, said so
  const none: GpuListing = { gpus: null, why: "no layer" };
  const blind = planGpus(none, 2, "", ALONE, {});
  assert.deepEqual(
    blind.ranks.map((r) => [r.index, r.env, r.adapter]),
    [
      [-1, {}, null],
      [-1, {}, null],
    ],
  );
  assert.match(
    blind.notes.join("\n"),
    /^WARNING 2 ranks on this host open the adapter Dawn picks, all the same one: the GPUs cannot be listed: no layer \(A13\)$/,
  );
});

test("a GPU that is not there is refused with the list of those that are; so are --gpus's other mistakes (A13)", () => {
  const l = listing(H100S);
  const refusal = (f: () => unknown, re: RegExp) =>
    assert.throws(
      f,
      (e: Error & { rule?: string }) => e.name === "UserError" && e.rule === "A13" && re.test(e.message),
    );
  refusal(
    () => planGpus(l, 1, "2", ALONE, {}),
    /^--gpus 2: this host has no GPU 2; its GPUs: GPU 0 0000:17:00\.0 "NVIDIA H100 80GB HBM3"; GPU 1 0000:2a:00\.0 "NVIDIA H100 80GB HBM3"; passed over, as a GPU is here: "llvmpipe \(LLVM 15\.0\.6, 256 bits\)" \(CPU, a software adapter\); run the same command with --gpus 0,1, or the same command without --gpus \(rank r takes GPU r\) \[A13\]$/,
  );
  refusal(() => planGpus(l, 1, "0000:41:00.0", ALONE, {}), /this host has no GPU 0000:41:00\.0; its GPUs: GPU 0 /);
  refusal(
    () => planGpus(l, 1, "0,1", ALONE, {}),
    /^--gpus 0,1 names 2 GPUs for 1 rank on this host: run the same command with --world 2 \(a rank per GPU\), or the same command with --gpus 0 \(the first 1\) \[A13\]$/,
  );
  refusal(
    () => planGpus({ gpus: null, why: "no layer" }, 1, "0", ALONE, {}),
    /^--gpus 0: the GPUs of this host cannot be listed: no layer; every rank opens the adapter Dawn picks: run the same command without --gpus \[A13\]$/,
  );
  const webgpu = ["--backend", "webgpu", "--world", "2"];
  refusal(() => parseArgs([...webgpu, "--gpus", "0,x"]), /^--gpus "0,x": "x" is neither a GPU index/);
  refusal(() => parseArgs([...webgpu, "--gpus", "1,1"]), /^--gpus "1,1": "1" is named twice/);
  refusal(() => parseArgs([...webgpu, "--gpus", "0000:17:00.0,17:00.0"]), /"17:00\.0" is named twice/);
  refusal(() => parseArgs(["--gpus", "0"]), /^--gpus chooses the devices of --backend webgpu, and --backend is auto/);
  assert.equal(parseArgs([...webgpu, "--gpus", "1, 0000:2a:00.0"]).config.gpus, "1, 0000:2a:00.0");
  assert.equal(parseArgs([]).config.gpus, "", "every GPU by default");
});
