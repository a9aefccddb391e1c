package lua

// Scripts of the purchase path; see each file's header.
var (
	Reserve = load("reserve.lua")
	Release = load("release.lua")
	Queued  = load("queued.lua")
	Claim   = load("claim.lua")
	Settle  = load("settle.lua")
	Warm    = load("warm.lua")
	Archive = load("archive.lua")
	// Recovered ends a sale's recovery after a Redis loss (its drain marker).
	Recovered = load("recovered.lua")
)
