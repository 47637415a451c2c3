// Package lab runs the real gpuaas system on one machine with no H200s:
// simulated host roots (hostsim), a MAAS 2.0 simulator (maassim), the
// agents' lab configuration (labagent), the hosts' onboarding (fleet) and
// a launcher (launch) that brings up coordinators and agents as processes
// on loopback. `make lab` runs its default: three coordinators loaded with
// this inventory, then one agent per lab host of seed 003 whose slots come
// from discovery and approval.
package lab

import _ "embed"

// Inventory is the lab's inventory: the region, the pool and the three
// lab nodes of seed 003 — j22u15 and j22u11 (slice_vm) and j27u15
// (baremetal) — registered, with no readiness and no slots. The
// coordinator API has no node registration (MAAS onboarding will bring
// nodes), so the inventory is how the lab's nodes exist; everything else
// comes from their agents: enrollment makes them active, readiness is
// observed, slots are approved from discovered candidates.
//
//go:embed inventory.json
var Inventory []byte
