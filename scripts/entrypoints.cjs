// tsc compiles src/, test/ and bench/ under dist/ (rootDir "."), so src/main.ts lands in
// dist/src/main.js. The documented entry points are dist/main.js, dist/prepare.js, dist/hub-server.js and
// dist/generate.js and dist/compare.js: this writes those five one-line launchers after every build.
const fs = require("node:fs");
const path = require("node:path");
const dist = path.join(__dirname, "..", "dist");
for (const name of ["main", "prepare", "hub-server", "generate", "compare"]) {
  const target = path.join(dist, "src", `${name}.js`);
  if (!fs.existsSync(target)) continue;
  fs.writeFileSync(path.join(dist, `${name}.js`), `#!/usr/bin/env node\n"use strict";\nrequire("./src/${name}.js");\n`);
}
