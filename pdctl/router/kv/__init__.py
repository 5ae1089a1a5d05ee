"""What the router holds of the engines' KV between turns: conversation identity, decode handles and their leases,
pins, their release and their journal, KV use and capacity per engine, aggregated mode's affinity, kept responses.
May import upstream and the base modules only.

    conversation    which conversation a request continues (explicit id, or derived from its history)
    handles         the table of decode handles: TTL by the router's clock, LRU bound, single use, leases
    pins            the decode KV the live handles pin (shared prefix blocks counted once)
    release         telling a decode to free blocks no turn will read
    retention       retained KV judged against each decode's own KV use: released under pressure, single turns
    journal         the file of the pins a router holds, so that the next router releases what a dead one left
    capacity        each decode's KV capacity and the pin budget
    usage           each engine's KV in use, polled from its /metrics (overflow's signal)
    affinity        conversation -> engine (aggregated mode, overflow) and the choice of engine
    response_store  the responses kept for `previous_response_id`
"""
