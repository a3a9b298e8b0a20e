/**
 * The Hub's rule for a repo id, in one place: what huggingface_hub's validate_repo_id accepts, with the owner
 * required (a run's repo is always owner/name). Each part is letters, digits, "_", "-" and "."; it starts and ends
 * with a letter, digit or "_" (so `owner/_x` is a name, `owner/-x` and `owner/x.` are not); "--" and ".." appear
 * nowhere; the name is at most 96 characters and does not end in ".git". The flags that name a repo (--hub-repo, an
 * hf:// input or model) are checked against it where they are read; the Hub client and the local Hub hold to it.
 */

/** The rule, in the words a refusal quotes. */
export const REPO_ID_RULE =
  'owner/name: letters, digits, "_", "-" and "."; each part starting and ending with a letter, digit or "_"; no "--" or ".."; the name at most 96 characters, not ending in ".git"';

const PART = /^[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?$/;

/** Whether `repo` is a repo id owner/name the Hub accepts (REPO_ID_RULE). */
export function isRepoId(repo: unknown): repo is string {
  if (typeof repo !== "string") return false;
  const parts = repo.split("/");
  return (
    parts.length === 2 &&
    parts.every((p) => PART.test(p)) &&
    parts[1].length <= 96 &&
    !repo.includes("--") &&
    !repo.includes("..") &&
    !repo.endsWith(".git")
  );
}
