/** The data layer in one import: manifest, store, fingerprint, permutation, sampler, cursor, plan, prepare, demo. */
export * from "./manifest";
export * from "./store";
export * from "./fingerprint";
export * from "./permutation";
export * from "./sampler";
export * from "./cursor";
export * from "./plan";
export { prepareMix, isValDoc, valPpm, DEFAULT_SHARD_TOKENS, DEFAULT_VAL_FRACTION } from "./prepare-mix";
export type { PrepareOptions, PrepareResult } from "./prepare-mix";
export { ensureDemoMix, demoMixIsReusable, DEMO_RECIPE, DEMO_VOCAB } from "./demo";
