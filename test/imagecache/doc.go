// Package imagecache tests the image path end to end against a real
// coordinator: the catalog and blob routes, an enrolled agent's
// authenticated client and the agent-side cache (agent/imagecache),
// including a connection cut mid-download by a TCP proxy, and benchmarks
// the cache's fetch against curl of the same blob (TestBenchImageCache).
package imagecache
