// Package proto is the gpuaas contract: the replicated object types, their
// state machines, the typed Raft commands, the error codes the API returns and
// the SKU catalog. It imports nothing of ours. A shape change starts here.
//
// Every replicated object carries CreateIndex and ModifyIndex, the Raft log
// indexes at which it was created and last changed. Objects read from the
// store are never modified in place: copy, change, propose.
package proto
