//go:build !chaos_stale_reads

package api

// staleConsistentReads is false in every real build. The fault rig
// (test/chaos) builds the coordinator with -tags chaos_stale_reads to make
// ?consistent=true reads skip the leader barrier and answer from the local
// replica, and proves its checker catches the stale reads that follow.
const staleConsistentReads = false
