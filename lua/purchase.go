package lua

// record holds the encodings of order records and user entries, and the
// names of the buckets that hold them.
const record = "record.lua"

// reserving holds reserve_one, the checks and the reservation of one
// purchase attempt, shared by Reserve and ReserveMulti.
const reserving = "reserving.lua"

// Scripts of the purchase path; see each file's header.
var (
	Reserve = load("reserve.lua", record, reserving)
	// ReserveMulti runs reserve_one for each request of a group (the
	// backend's group commit), one reply each.
	ReserveMulti = load("reserve_multi.lua", record, reserving)
	Release      = load("release.lua", record)
	Queued       = load("queued.lua", record)
	// Requeued writes back a lost record whose publish was confirmed late.
	Requeued = load("requeued.lua", record)
	Claim    = load("claim.lua", record)
	Settle   = load("settle.lua", record)
	Warm     = load("warm.lua", record)
	Archive  = load("archive.lua", record)
	Restore  = load("restore.lua", record)
	Order    = load("order.lua", record)
	// HeldKeys reads the keys that hold an order in a sold-out sale (the
	// proxy's keyed sold-out answers).
	HeldKeys = load("heldkeys.lua", record)
)

// consumerRegistry holds the helpers of the drain markers' consumer registry.
const consumerRegistry = "registry.lua"

// Scripts of the drain markers that end a sale's recovery after a Redis loss.
var (
	Consumers = load("consumers.lua", consumerRegistry)
	Pass      = load("pass.lua", consumerRegistry)
)
