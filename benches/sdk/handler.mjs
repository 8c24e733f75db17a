// An empty handler for benches/sdk/run.py: the TypeScript SDK's own cost per child.
export default async function empty() {
  return null;
}
