//go:build chaos_stale_reads

package api

// staleConsistentReads breaks the ledger on purpose (test-only build tag
// chaos_stale_reads): ?consistent=true reads are served from the local
// replica like default reads. Never built into a real binary; see
// brokenreads_off.go.
const staleConsistentReads = true
