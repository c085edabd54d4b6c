"""`failsoft bench`: router overhead, failover overhead, the placements side by side, planner accuracy."""
