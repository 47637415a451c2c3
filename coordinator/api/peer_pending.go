package api

// Peer stands in for server.Peer until the server branch is merged.
type Peer struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr,omitempty"`
	Voter    bool   `json:"voter"`
	Leader   bool   `json:"leader"`
}
