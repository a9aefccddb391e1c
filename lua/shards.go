package lua

// Scripts of the stock shards of one sale: moving units between shards
// (move_out.lua, move_in.lua, move_done.lua) and the reconciler's repair of
// their totals (allot.lua).
var (
	MoveOut  = load("move_out.lua")
	MoveIn   = load("move_in.lua")
	MoveDone = load("move_done.lua")
	Allot    = load("allot.lua")
)
