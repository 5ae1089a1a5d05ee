"""The APIs clients speak, each as request in -> one internal turn (or several) -> response out: chat and
completions, the Responses API, Anthropic Messages. May import turn, kv, upstream and the base modules; never server.

    chat          POST /v1/chat/completions and /v1/completions: one turn, or batches
    batches       a list of prompts (one turn each) and n > 1 (a decode alone)
    responses     POST /v1/responses (responses_in: to chat; responses_out: the Responses shape)
    messages      POST /v1/messages (messages_in: to chat; messages_out: the Messages shape)
    translated    the ASGI send that renders a chat answer in another API's shape, whole or streamed
    rendering     the skeleton of the Messages and Responses renderers (one output open at a time)
    chatstream    a chat answer as neutral events (whole and streamed alike)
"""
