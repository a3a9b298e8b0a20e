// The shared-memory layout (B4): master weights and Adam moments exist once, whatever the world size.
import { test } from "node:test";
import assert from "node:assert/strict";
import { allocShared, viewShared, stagingView, STAGE_M, STAGE_PARTS, CTL_LENGTH } from "../src/actors/shm";

test("params, m and v are allocated once and only the gradient slots grow with the world (B4)", () => {
  for (const world of [1, 2, 4]) {
    const b = allocShared(1000, world);
    assert.equal(b.params.byteLength, 4000);
    assert.ok(!("paramsT" in b), "no transposed twin: the ranks multiply against params directly");
    assert.equal(b.m.byteLength, 4000);
    assert.equal(b.v.byteLength, 4000);
    assert.equal(b.slots.length, world);
    assert.equal(b.ctl.byteLength, CTL_LENGTH * 4);
    const v = viewShared(b);
    v.params[3] = 1.5;
    assert.equal(viewShared(b).params[3], 1.5, "views share the buffer");
  }
});

test("the staging buffer holds params|m|v back to back", () => {
  const buf = new SharedArrayBuffer(STAGE_PARTS * 10 * 4);
  stagingView(buf, 10, STAGE_M)[0] = 7;
  assert.equal(new Float32Array(buf)[10], 7);
});
