-- Argo CD health check for rbak.io RabbitMQRestore (Lua 5.1, as Argo CD runs it).
-- Reads only what the rbak operator writes (operator/rbak_operator/reconcile/restore.py):
--   Healthy     - phase Succeeded: the restore's run finished and the target confirmed it
--   Degraded    - phase Failed (an invalid spec or a failed run), with condition Completed's message
--   Progressing - not started yet, running, or being deleted
-- A restore runs once; it has no Suspended state.
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

local hs = { status = "Progressing", message = "Waiting for the rbak operator to start the restore" }

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.message = "Pending deletion"
  return hs
end
local st = obj.status
if st == nil or st.phase == nil or st.phase == "" then
  return hs
end

if st.phase == "Succeeded" then
  hs.status = "Healthy"
  if st.dryRun then
    hs.message = "Dry run of backup " .. tostring(st.backupId) .. ": would publish " .. tostring(st.wouldPublish or 0) .. " messages"
    return hs
  end
  hs.message = "Restored backup " .. tostring(st.backupId)
  if st.messages ~= nil then
    hs.message = hs.message .. ": " .. tostring(st.messages) .. " messages confirmed"
  end
  return hs
end
if st.phase == "Failed" then
  hs.status = "Degraded"
  local done = condition("Completed")
  if done ~= nil and done.status == "False" then
    hs.message = (done.reason or "RestoreFailed") .. ": " .. (done.message or "")
  else
    hs.message = st.message or st.reason or "the restore failed"
  end
  return hs
end

hs.status = "Progressing"
local p = condition("Progressing")
hs.message = (p ~= nil and p.message) or ("restore " .. st.phase)
if st.progress ~= nil and st.progress.summary ~= nil then
  hs.message = hs.message .. " (" .. st.progress.summary .. ")"
end
return hs
