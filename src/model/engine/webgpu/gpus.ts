/**
 * The host's GPUs for the webgpu engine (engine.ts ties the engine together; A13): listed once, in a stable order,
 * and each rank's choice of one, as the environment and Dawn flag that open it (device.ts opens it).
 *
 * Dawn's requestAdapter() has no index, and its `adapter=NAME` flag matches names, which identical GPUs share. What
 * tells devices apart is Mesa's Vulkan device-select layer (VkLayer_MESA_device_select, installed with
 * mesa-vulkan-drivers; an implicit layer over every Vulkan driver, NVIDIA's included). It reads its variables when an
 * instance first enumerates its devices (Dawn: the instance's first requestAdapter):
 *  - MESA_VK_DEVICE_SELECT=list prints every device ("GPU i: vid:did "name" type [dddd:bb:dd.f]") and exits the
 *    process: the list is taken in a child process (listHostGpus);
 *  - DRI_PRIME=pci-DDDD_BB_DD_F! exposes only the device at that PCI address (drivers with VK_EXT_pci_bus_info:
 *    NVIDIA, AMD, Intel), MESA_VK_DEVICE_SELECT=vid:did! only the last device with that vendor:device id.
 * A rank's device is chosen by PCI address where it has one, else by a vendor:device id no other device has, else by
 * a name no other device's contains (Dawn's adapter= flag). Devices with none of these (the same id and name, no PCI
 * address: only software adapters, e.g. lavapipe loaded twice) cannot be told apart: ranks on either open the
 * first adapter of that name, and the start says so.
 * The variables are process-wide (getenv): the main thread sets them (process.env writes the real environment; a
 * worker's is a copy) around the opening of each rank's instance, the ranks of one choice at a time
 * (actors/coordinator.ts; withDeviceEnv).
 */
import { spawnSync } from "node:child_process";
import { isMainThread } from "node:worker_threads";
import { parseGpuChoice } from "../../../config";
import { type FlagChange, UserError } from "../../../errors";

/** One Vulkan device as the device-select layer lists it. */
export interface HostGpu {
  /** Its index in the order ranks take them (listHostGpus). */
  index: number;
  vendorId: number;
  deviceId: number;
  name: string;
  /** Vulkan's device type in the layer's words: "discrete GPU", "integrated GPU", "virtual GPU", "CPU", "other". */
  type: string;
  /** The PCI address, "0000:17:00.0", or null (a driver without VK_EXT_pci_bus_info: software adapters). */
  pci: string | null;
}

/** The host's devices, as ranks take them, or why they could not be listed. */
export type GpuListing =
  | {
      /** The GPUs, by PCI address (then the layer's order); where there is none, the software adapters. */
      gpus: HostGpu[];
      /** Software adapters passed over because a GPU is there. */
      passed: HostGpu[];
      /** Every device the layer listed, in its order (what the variables choose among). */
      all: HostGpu[];
    }
  | { gpus: null; why: string };

/** How a rank opens its GPU: the device-select layer's variables while its instance enumerates, and Dawn's flag. */
export interface GpuSelect {
  /** The GPU's index in the host's order; -1 where the devices could not be listed (Dawn's own choice). */
  index: number;
  /** The GPU in words: `GPU 1 0000:17:00.0 "NVIDIA H100 80GB HBM3"` or `GPU 0 "llvmpipe (...)" (no PCI address)`. */
  label: string;
  /** The variables, set (a string) or unset (null), while the rank's Dawn instance enumerates its devices. */
  env: Record<string, string | null>;
  /** Dawn's adapter= flag (a name only this device's contains), or null. */
  adapter: string | null;
}

/** The device-select layer's variables a choice sets or unsets. */
const SELECT_VARS = ["MESA_VK_DEVICE_SELECT", "DRI_PRIME", "MESA_VK_DEVICE_SELECT_FORCE_DEFAULT_DEVICE"] as const;

/** The layer's list ("selectable devices:" then a line per device) read from its output; null without one. */
export function parseDeviceList(text: string): Omit<HostGpu, "index">[] | null {
  const lines = text.split("\n");
  const at = lines.findIndex((l) => l.trim() === "selectable devices:");
  if (at < 0) return null;
  const out: Omit<HostGpu, "index">[] = [];
  for (const l of lines.slice(at + 1)) {
    const m =
      /^\s*GPU \d+: ([0-9a-f]+):([0-9a-f]+) "(.*)" (.+?)(?: ([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]))?\s*$/.exec(
        l,
      );
    if (!m) break;
    out.push({
      vendorId: Number.parseInt(m[1], 16),
      deviceId: Number.parseInt(m[2], 16),
      name: m[3],
      type: m[4],
      // the layer prints an address for every device once one driver has VK_EXT_pci_bus_info: zeros where it has none
      pci: m[5] && m[5] !== "0000:00:00.0" ? m[5] : null,
    });
  }
  return out;
}

/**
 * The order ranks take the devices in: those with a PCI address by address, then the rest in the layer's order;
 * software adapters (type CPU) only where no other device is. Indexes follow that order.
 */
export function orderGpus(devices: readonly Omit<HostGpu, "index">[]): Extract<GpuListing, { all: HostGpu[] }> {
  const all = devices.map((d, i) => ({ ...d, index: i }));
  const hard = all.filter((d) => d.type !== "CPU");
  const taken = hard.length > 0 ? hard : all;
  const sorted = [...taken].sort((a, b) =>
    a.pci && b.pci ? (a.pci < b.pci ? -1 : a.pci > b.pci ? 1 : 0) : a.pci ? -1 : b.pci ? 1 : a.index - b.index,
  );
  return {
    gpus: sorted.map((d, i) => ({ ...d, index: i })),
    passed: all.filter((d) => !taken.includes(d)).map((d) => ({ ...d, index: -1 })),
    all,
  };
}

let listed: GpuListing | null = null;

/**
 * The host's devices (once per process): the device-select layer's list, taken in a child process that loads Dawn
 * with MESA_VK_DEVICE_SELECT=list (the layer prints it and exits), ordered by orderGpus. `script` is the child's
 * code (device.ts: the one that opens an instance).
 */
export function listHostGpus(script: string): GpuListing {
  if (listed) return listed;
  const env: NodeJS.ProcessEnv = { ...process.env, MESA_VK_DEVICE_SELECT: "list" };
  delete env.MESA_VK_DEVICE_SELECT_DEBUG;
  const r = spawnSync(process.execPath, ["-e", script], { encoding: "utf8", timeout: 60_000, env });
  const devices = parseDeviceList(`${r.stderr ?? ""}\n${r.stdout ?? ""}`);
  listed = devices?.length
    ? orderGpus(devices)
    : {
        gpus: null,
        why:
          process.env.NODEVICE_SELECT !== undefined
            ? "NODEVICE_SELECT is set, which turns off Mesa's Vulkan device-select layer that lists them"
            : "Mesa's Vulkan device-select layer (VkLayer_MESA_device_select, in the package mesa-vulkan-drivers) did not list them: it is not installed, or no Vulkan driver is",
      };
  return listed;
}

/** A device in words for the start line and the refusals. */
export function gpuWords(g: HostGpu): string {
  return `GPU ${g.index} ${g.pci ? `${g.pci} ` : ""}"${g.name}"${g.pci ? "" : " (no PCI address)"}`;
}

const hex = (n: number) => n.toString(16);

/** Whether two devices have nothing that tells them apart: the same id and name, and no PCI address. */
function twins(a: HostGpu, b: HostGpu): boolean {
  return !a.pci && !b.pci && a.vendorId === b.vendorId && a.deviceId === b.deviceId && a.name === b.name;
}

/** How to open `g` among `all` (the layer's whole list): by PCI address, a unique id, or a name no other's contains. */
export function selectGpu(g: HostGpu, all: readonly HostGpu[]): GpuSelect {
  const unset: Record<string, string | null> = Object.fromEntries(SELECT_VARS.map((v) => [v, null]));
  const label = gpuWords(g);
  if (g.pci) {
    const [dom, bus, devFn] = g.pci.split(":");
    const [dev, fn] = devFn.split(".");
    return { index: g.index, label, env: { ...unset, DRI_PRIME: `pci-${dom}_${bus}_${dev}_${fn}!` }, adapter: null };
  }
  if (all.filter((d) => d.vendorId === g.vendorId && d.deviceId === g.deviceId).length === 1)
    return {
      index: g.index,
      label,
      env: { ...unset, MESA_VK_DEVICE_SELECT: `${hex(g.vendorId)}:${hex(g.deviceId)}!` },
      adapter: null,
    };
  // Dawn's adapter= takes the first adapter whose name contains it: this one, or its first twin, where no other
  // device's name contains it; else Dawn's first adapter (the layer's default device)
  const clash = all.some((d) => !twins(d, g) && d.name.includes(g.name));
  return { index: g.index, label, env: unset, adapter: clash ? null : g.name };
}

/** This process's place among the MPI processes on its host (A9): its local rank and their count; 0 of 1 alone. */
export function localProcess(env: NodeJS.ProcessEnv = process.env): { rank: number; size: number } {
  const first = (names: string[]) =>
    names.map((n) => Number.parseInt(env[n] ?? "", 10)).find((v) => Number.isSafeInteger(v) && v >= 0);
  const size = first(["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"]);
  const rank = first(["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"]);
  return size && size >= 1 && rank !== undefined && rank < size ? { rank, size } : { rank: 0, size: 1 };
}

/** Each rank's GPU, and what the start says of them (ranks that share a GPU, GPUs that cannot be told apart). */
export interface GpuPlan {
  /** Rank r's GPU. */
  ranks: GpuSelect[];
  /** Warnings for the start, each naming A13. */
  notes: string[];
}

/** The listed GPUs in words, for a refusal: every one, and the software adapters passed over. */
function listWords(l: Extract<GpuListing, { all: HostGpu[] }>): string {
  const passed = l.passed.length
    ? `; passed over, as a GPU is here: ${l.passed.map((d) => `"${d.name}" (${d.type}, a software adapter)`).join(", ")}`
    : "";
  return `${l.gpus.map(gpuWords).join("; ")}${passed}`;
}

/**
 * Rank r's GPU for `world` ranks and --gpus `choice` (A13): the r-th of the chosen GPUs, or of the host's when
 * none is chosen; under an MPI launcher, this process's ranks follow those of the processes before it on the host.
 * Refused (UserError A13), before any work: a GPU the host does not have, with the list of those it has; more GPUs
 * named than the host's ranks; any choice where the GPUs could not be listed. The device-select variables of `env`
 * (the user's DRI_PRIME, say) are set aside, with a warning.
 */
export function planGpus(
  listing: GpuListing,
  world: number,
  choice: string,
  local: { rank: number; size: number } = localProcess(),
  env: NodeJS.ProcessEnv = process.env,
): GpuPlan {
  const names = parseGpuChoice(choice);
  if (typeof names === "string") throw new UserError("A13", `--gpus ${JSON.stringify(choice)}: ${names}`);
  const hostRanks = world * local.size;
  const ofProcess = local.size > 1 ? ` (process ${local.rank} of the ${local.size} on this host)` : "";
  if (listing.gpus === null) {
    if (names.length > 0)
      throw new UserError(
        "A13",
        `--gpus ${choice}: the GPUs of this host cannot be listed: ${listing.why}; every rank opens the adapter Dawn picks: run `,
        { ways: [{ changes: [["--gpus", null]] }] },
      );
    const dawn: GpuSelect = { index: -1, label: "the adapter Dawn picks", env: {}, adapter: null };
    const notes =
      hostRanks > 1
        ? [
            `WARNING ${hostRanks} ranks on this host open the adapter Dawn picks, all the same one: the GPUs cannot be listed: ${listing.why} (A13)`,
          ]
        : [];
    return { ranks: Array.from({ length: world }, () => dawn), notes };
  }
  const chosen = names.length
    ? names.map((n) => {
        const g = "index" in n ? listing.gpus[n.index] : listing.gpus.find((d) => d.pci === n.pci);
        if (!g)
          throw new UserError(
            "A13",
            `--gpus ${choice}: this host has no GPU ${"index" in n ? n.index : n.pci}; its GPUs: ${listWords(listing)}; run `,
            {
              ways: [
                { changes: [["--gpus", listing.gpus.map((d) => d.index).join(",")]] },
                { changes: [["--gpus", null]], why: "rank r takes GPU r" },
              ],
            },
          );
        return g;
      })
    : listing.gpus;
  if (names.length > hostRanks)
    throw new UserError(
      "A13",
      `--gpus ${choice} names ${names.length} GPUs for ${hostRanks} rank${hostRanks > 1 ? "s" : ""} on this host: run `,
      {
        ways: [
          ...(local.size === 1
            ? [{ changes: [["--world", String(names.length)]] as FlagChange[], why: "a rank per GPU" }]
            : []),
          {
            changes: [["--gpus", choice.split(",").slice(0, hostRanks).join(",")]],
            why: `the first ${hostRanks}`,
          },
        ],
      },
    );
  const ranks = Array.from({ length: world }, (_, r) => chosen[(local.rank * world + r) % chosen.length]);
  const notes: string[] = [];
  if (hostRanks > chosen.length) {
    const used = [...new Set(ranks)];
    const map = used.map((g) => {
      const rs = ranks.flatMap((x, r) => (x === g ? [r] : []));
      return `${gpuWords(g)} <- rank${rs.length > 1 ? "s" : ""} ${rs.join(", ")}`;
    });
    notes.push(
      `WARNING ${hostRanks} ranks on ${chosen.length} GPU${chosen.length > 1 ? "s" : ""}: ranks share ${chosen.length > 1 ? "them" : "it"}${ofProcess}: ${map.join("; ")}; each GPU's ranks take turns on it (A13)`,
    );
  }
  const set = SELECT_VARS.filter((v) => env[v] !== undefined);
  if (set.length)
    notes.push(
      `WARNING ${set.map((v) => `${v}=${env[v]}`).join(" ")} in the environment is set aside: each rank's GPU is chosen by --gpus (A13)`,
    );
  const used = [...new Set(ranks)];
  for (const [i, g] of used.entries()) {
    const same = used.slice(i + 1).filter((h) => twins(g, h));
    if (same.length)
      notes.push(
        `WARNING ${[g, ...same].map((d) => `GPU ${d.index}`).join(" and ")} cannot be told apart ("${g.name}", the same vendor:device id ${hex(g.vendorId)}:${hex(g.deviceId)}, no PCI address): their ranks all open the first of them (A13)`,
      );
  }
  return { ranks: ranks.map((g) => selectGpu(g, listing.all)), notes };
}

/**
 * Sets the device-select layer's variables of `env` in this process's real environment (the main thread's
 * process.env; a variable mapped to null is unset) and returns what puts them back. A worker's process.env is a
 * copy, which Vulkan never reads: called elsewhere it throws.
 */
export function withDeviceEnv(env: Record<string, string | null>): () => void {
  if (!isMainThread) throw new Error("webgpu: a device's environment is set on the main thread only");
  const before = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  const put = (vars: Record<string, string | null | undefined>) => {
    for (const [k, v] of Object.entries(vars)) {
      if (v === null || v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  };
  put(env);
  return () => put(before);
}
