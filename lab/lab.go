// Package lab runs the real gpuaas system on one machine with no H200s:
// simulated host roots (hostsim), a MAAS 2.0 simulator (maassim) and a
// launcher that brings up coordinators (and agents) as processes on
// loopback. `make lab` runs its default: three coordinators loaded with the
// inventory of the three lab hosts of seed 003.
package lab

import _ "embed"

// Inventory is the lab's inventory (regions, pools, the three lab hosts
// and their approved slots), as agent discovery reports the simulated
// hosts: j22u15 and j22u11 slice hosts (j22u11 has one disk with a mounted
// host share, so 7 of its 8 candidates are complete), j27u15 baremetal.
//
//go:embed inventory.json
var Inventory []byte
