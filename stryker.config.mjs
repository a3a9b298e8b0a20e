// Mutation testing (issue 14). Run it through `npm run mutate -- <module>` (scripts/mutate.cjs), which sets
// STRYKER_MUTATE (the module's file) and STRYKER_TESTS (the test files that exercise it) and prints the score.
// Not part of `npm test`.
const mutate = (process.env.STRYKER_MUTATE ?? "src/actors/optim.ts").split(",");
const testFiles = (process.env.STRYKER_TESTS ?? "dist/test/train.optim.test.js").split(",");

/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  packageManager: "npm",
  testRunner: "tap",
  tap: { testFiles, forceBail: true },
  // The sandbox compiles the instrumented sources (tsc emits despite the instrumenter's type noise; the
  // entry-point launchers are written after it).
  buildCommand: "node scripts/mutate-build.cjs",
  mutate,
  // Rank workers run the optimizer's slices: their coverage is not reported to the tap hook, so coverage-guided
  // test selection would call their mutants "no coverage". Every mutant runs the module's test files instead.
  coverageAnalysis: process.env.STRYKER_COVERAGE ?? "off",
  checkers: process.env.STRYKER_TSC === "1" ? ["typescript"] : [],
  tsconfigFile: "tsconfig.json",
  typescriptChecker: { prioritizePerformanceOverAccuracy: true },
  concurrency: Number(process.env.STRYKER_CONCURRENCY ?? 2),
  timeoutMS: 20000,
  timeoutFactor: 2,
  disableTypeChecks: "{src,test}/**/*.ts",
  ignorePatterns: ["dist", "build", "run", "mix", ".demo", "bench-out", "reports", ".stryker-tmp"],
  reporters: ["clear-text", "json", "progress"],
  jsonReporter: { fileName: `reports/mutation/${mutate[0].replace(/:.*$/, "").replace(/[/.]/g, "_")}.json` },
  tempDirName: ".stryker-tmp",
  cleanTempDir: true,
};
