-- Argo CD health check for rbak.io RabbitMQBackup (Lua 5.1, as Argo CD runs it).
-- Reads only what the rbak operator writes (operator/rbak_operator/reconcile/backup.py):
--   Degraded    - condition Ready=False (a failed, partial or not validating run, an invalid
--                 schedule), a later validation that failed, or a failed restore drill
--   Suspended   - spec.suspend: scheduled runs are skipped
--   Progressing - a run is active, the object is being deleted, or the operator has not
--                 yet observed its current generation
--   Healthy     - the last run succeeded, or the object waits for its first run
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

local function failing(c)
  local msg = c.message or ""
  if c.reason ~= nil and c.reason ~= "" then
    msg = c.reason .. ": " .. msg
  end
  return msg
end

local hs = { status = "Progressing", message = "Waiting for the rbak operator" }

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.message = "Pending deletion"
  return hs
end
local st = obj.status
if st == nil or st.phase == nil or st.phase == "" then
  return hs
end
if obj.metadata ~= nil and obj.metadata.generation ~= nil and st.observedGeneration ~= nil
    and st.observedGeneration < obj.metadata.generation then
  hs.message = "Waiting for the rbak operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end

local ready = condition("Ready")
if ready ~= nil and ready.status == "False" then
  hs.status = "Degraded"
  hs.message = failing(ready)
  return hs
end
local last = st.lastRun
if last ~= nil and last.validation == "Failed" then
  hs.status = "Degraded"
  hs.message = "ValidationFailed: backup " .. tostring(last.backupId) .. " " .. (last.message or "failed validation")
  return hs
end
if st.phase == "Failed" then
  hs.status = "Degraded"
  hs.message = (last ~= nil and last.message) or "the last backup run failed"
  return hs
end
local drill = st.restoreDrill
if drill ~= nil and drill.result == "Failed" then
  hs.status = "Degraded"
  hs.message = "restore drill " .. tostring(drill.lastJob or "") .. " of backup " .. tostring(drill.backupId or "")
    .. " failed: " .. (drill.message or "")
  return hs
end

if st.active ~= nil and #st.active > 0 or st.phase == "Running" then
  hs.status = "Progressing"
  local p = condition("Progressing")
  hs.message = (p ~= nil and p.message) or "backup running"
  if st.progress ~= nil and st.progress.summary ~= nil then
    hs.message = hs.message .. " (" .. st.progress.summary .. ")"
  end
  return hs
end
if st.phase == "Suspended" or (obj.spec ~= nil and obj.spec.suspend == true) then
  hs.status = "Suspended"
  hs.message = "Scheduled backups are suspended (spec.suspend)"
  return hs
end

hs.status = "Healthy"
if st.lastBackupId ~= nil and last ~= nil then
  hs.message = "Last backup " .. st.lastBackupId .. " succeeded"
  if last.messages ~= nil then
    hs.message = hs.message .. ": " .. tostring(last.messages) .. " messages, " .. tostring(last.size)
  end
  if last.validation == "Pending" then
    hs.message = hs.message .. " (validation pending)"
  end
elseif st.nextScheduleTime ~= nil then
  hs.message = "No backup yet; next run at " .. st.nextScheduleTime
else
  hs.message = "No backup yet"
end
return hs
