/** Every shader of the webgpu engine by name (framework.ts: how one is declared; the families beside it). */
import type { ParamValues } from "./framework";
import { matmul_nn, matmul_nt, matmul_tn, matmul_tt, matmuls, matmulReduce } from "./matmul";
import {
  copy,
  crossEntropy,
  embeddingBackward,
  embeddingForward,
  fill,
  rmsnormBackward,
  rmsnormBackwardW,
  rmsnormForward,
  rope,
  ropeQK,
  swigluBackward,
  swigluForward,
} from "./rows";
import { attentionBackward, attentionCachedForward, attentionForward } from "./attention";
import { foldMicro } from "./fold";

/** Every shader by name; each has one entry point, `main`. */
export const SHADERS = {
  matmul_nn,
  matmul_nt,
  matmul_tn,
  matmul_tt,
  matmuls,
  matmul_reduce: matmulReduce,
  embeddingForward,
  embeddingBackward,
  rmsnormForward,
  rmsnormBackward,
  rmsnormBackwardW,
  rope,
  ropeQK,
  attentionForward,
  attentionCachedForward,
  attentionBackward,
  swigluForward,
  swigluBackward,
  crossEntropy,
  copy,
  fill,
  foldMicro,
} as const;

export type ShaderName = keyof typeof SHADERS;
/** The settings a dispatch of shader N takes, by name. */
export type ParamsOf<N extends ShaderName> = ParamValues<(typeof SHADERS)[N]["params"]>;
