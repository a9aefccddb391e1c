package lua

// RoomEnter gives a client its place in a waiting room, or its admission;
// see room_enter.lua.
var RoomEnter = load("room_enter.lua", "room_lib.lua")

// RoomTick moves a waiting room's line; see room_tick.lua.
var RoomTick = load("room_tick.lua", "room_lib.lua")
