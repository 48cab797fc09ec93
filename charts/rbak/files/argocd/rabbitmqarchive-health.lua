-- Argo CD health check for rbak.io RabbitMQArchive (Lua 5.1, as Argo CD runs it).
-- Reads only what the rbak operator writes from the archive in the storage (reconcile/archive.py):
--   Degraded    - RPOMet False (the archive is further behind than spec.rpoSeconds), a recorded gap
--                 (condition Degraded), or an invalid spec (phase Failed); with the condition's message
--   Suspended   - spec.suspend: the archiver is scaled to 0
--   Progressing - no recovery point yet (the archiver is starting), or being deleted
--   Healthy     - RPOMet True: every stream archived within the objective
local function condition(ctype)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local hs = { status = "Progressing", message = "Waiting for the rbak operator to read the archive" }

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.message = "Pending deletion"
  return hs
end
local st = obj.status
if st == nil or st.phase == nil or st.phase == "" then
  return hs
end
if st.phase == "Failed" then
  local ready = condition("Ready")
  hs.status = "Degraded"
  hs.message = ready ~= nil and tostring(ready.message) or "Invalid spec"
  return hs
end
if obj.spec ~= nil and obj.spec.suspend then
  hs.status = "Suspended"
  hs.message = "Suspended: the archiver is scaled to 0"
  return hs
end
local rpo = condition("RPOMet")
local degraded = condition("Degraded")
if rpo ~= nil and rpo.status == "False" then
  hs.status = "Degraded"
  hs.message = "Recovery point objective missed: " .. tostring(rpo.message)
  return hs
end
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = tostring(degraded.message)
  return hs
end
if rpo ~= nil and rpo.status == "True" then
  hs.status = "Healthy"
  hs.message = "Recoverable until " .. tostring(st.recoverableUntil) .. ", lag " .. tostring(st.lagSeconds) .. "s"
  return hs
end
hs.message = "No recovery point yet: " .. tostring((condition("Ready") or {}).message)
return hs
