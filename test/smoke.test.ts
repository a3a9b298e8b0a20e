import { test } from "node:test";
import assert from "node:assert/strict";
test("the toolchain runs a test", () => { assert.equal(1 + 1, 2); });
