/**
 * sha256 of `node dist/main.js --world 2 --demo`'s final/model.safetensors (every default), on every kernel and
 * machine, and of any split of the same global batch (`mpirun -np 2 ... --dist mpi --world 1 --demo`). Change it
 * only with a change of results that is meant, and say so in the commit.
 */
export const DEMO_SHA256 = "0e405c69cb876df4091472b0d56084e65f47eacb351fe6d6b6eb4db3a5256c9b";
